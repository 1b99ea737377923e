"""The admission policies' guarantees computed from a SchedulerConfig: what the sched tests hold the scheduler to."""

from __future__ import annotations

from sglang_asym.sched import AdmissionDecision, AdmitPolicy, SchedulerConfig, StepPlan


def max_rows_per_step(config: SchedulerConfig) -> int:
    """Most rows one step can hold under the budget policy.

    Without an over-budget admission a step stays within token_budget. An aged (or unopposed) head is
    admitted alone, next to at most max_running - 1 running requests of verify_width rows each.
    Chunked windows never go over the budget (see sched/plan.py).
    """
    if config.policy is not AdmitPolicy.BUDGET:
        raise ValueError(f"max_rows_per_step covers the budget policy only, not {config.policy.value!r}")
    if config.window_chunk is not None:
        return config.token_budget
    forced_head_step = (config.max_running - 1) * config.verify_width + config.window
    return max(config.token_budget, forced_head_step)


def max_admission_delay_steps(config: SchedulerConfig, requests_ahead: int | None = None) -> int:
    """Most steps from enqueue to admission, plus one for every step in between whose running batch was full.

    Every step with a free running slot admits at least the queue head once the head may go: at once
    under admit_all, after max_wait_steps under the budget policy (by then everyone ahead, being
    older, may go too). So a request with p requests ahead of it at enqueue is admitted within
    p (admit_all) or max_wait_steps + p (budget) steps. Without `requests_ahead`, p is the worst
    case max_waiting - 1 (the queue capacity).

    Chunked windows (budget policy): the bound is on the step that runs the request's LAST chunk. Every
    step with a free slot runs a chunk of the queue head of at least min_chunk_rows(config) rows (or
    all it has left), so the request and everyone ahead need at most ceil(window / min_chunk_rows)
    steps each.
    """
    ahead = config.max_waiting - 1 if requests_ahead is None else requests_ahead
    if isinstance(ahead, bool) or not isinstance(ahead, int) or not 0 <= ahead < config.max_waiting:
        raise ValueError(f"requests_ahead must be an int in [0, max_waiting={config.max_waiting}), got {ahead!r}")
    if config.policy is AdmitPolicy.ADMIT_ALL:
        return ahead
    if config.window_chunk is not None:
        return (ahead + 1) * -(-config.window // min_chunk_rows(config)) - 1
    return config.max_wait_steps + ahead


def min_chunk_rows(config: SchedulerConfig) -> int:
    """Chunked windows: the fewest rows the queue head runs in a step with a free running slot (unless it
    has fewer left). At most max_running - 1 requests decode then, so the budget leaves at least this."""
    if config.window_chunk is None:
        raise ValueError("min_chunk_rows applies to chunked windows (window_chunk set)")
    return min(config.window_chunk, config.token_budget - (config.max_running - 1) * config.verify_width)


def blocked(plan: StepPlan) -> AdmissionDecision | None:
    """The first waiting request that was not admitted, with the reason (None if the queue was drained)."""
    if plan.decisions and not plan.decisions[-1].admitted:
        return plan.decisions[-1]
    return None
