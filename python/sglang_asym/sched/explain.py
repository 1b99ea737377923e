"""One-line human explanations of scheduling decisions, for the scheduler's debug log."""

from __future__ import annotations

from typing import Sequence

from .config import SchedulerConfig
from .graphs import GraphChoice
from .plan import AdmissionDecision, AdmitReason, StepPlan


def explain_decision(d: AdmissionDecision, config: SchedulerConfig, queued_behind: int) -> str:
    """Why request d was admitted or held; `queued_behind` counts the waiting requests after it."""
    who = f"{d.request_id!r} ({d.window_rows} window rows, waited {d.age} steps)"
    budget = f"{d.budget_left} of token budget {config.token_budget} left"
    if d.reason is AdmitReason.FITS:
        return f"admit {who}: fits, {budget}, {d.window_rows_left} window rows left"
    if d.reason is AdmitReason.CHUNK:
        return (f"admit {d.chunk_rows} rows of {who}: the rest waits at the head, {budget}, "
                f"{d.window_rows_left} window rows left")
    if d.reason is AdmitReason.AGED:
        return f"admit {who} over the token budget ({budget}): waited >= max_wait_steps={config.max_wait_steps}"
    if d.reason is AdmitReason.NO_DECODE:
        return f"admit {who} over the token budget ({budget}): no running request to slow down"
    if d.reason is AdmitReason.ADMIT_ALL:
        return f"admit {who}: admit_all policy"
    held = f"hold {who} and {queued_behind} behind it"
    if d.reason is AdmitReason.NO_SLOT:
        return f"{held}: running batch full (max_running={config.max_running})"
    if d.reason is AdmitReason.OVER_WINDOW_BOUND:
        return (f"{held}: needs {d.window_rows} rows, {d.window_rows_left} of max_window_rows_per_step="
                f"{config.max_window_rows_per_step} left")
    steps_to_aging = max(config.max_wait_steps - d.age, 0)
    return f"{held}: needs {d.window_rows} rows, {budget}; at the head it is admitted anyway in {steps_to_aging} steps"


def explain_step(plan: StepPlan, graphs: Sequence[GraphChoice]) -> str:
    """Summary of a planned step: shape, rows against the budget, and each forward's graph."""
    forwards = ", ".join(
        f"{g.forward.value}:{g.kind.value} {g.actual_rows}->{g.padded_rows} rows{list(g.padded_shape)}" for g in graphs
    )
    over = " OVER BUDGET" if plan.exceeds_budget else ""
    return (
        f"step {plan.step} {plan.shape.value}: decode {len(plan.decode)} req / {plan.decode_rows} rows, "
        f"admit {len(plan.admitted)} req / {plan.window_rows} rows, total {plan.total_rows} of "
        f"{plan.token_budget}{over}; forwards [{forwards}]"
    )
