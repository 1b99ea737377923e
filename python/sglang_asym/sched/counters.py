"""Immutable running totals of what the scheduler did: steps by shape, forwards by graph kind, request outcomes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from .graphs import GraphChoice, GraphKind
from .plan import StepPlan, StepShape

COUNTED_SHAPES = tuple(s for s in StepShape if s is not StepShape.IDLE)  # idle steps are not steps


def _zeros(keys: Sequence) -> dict:
    return {k: 0 for k in keys}


@dataclass(frozen=True)
class SchedulerCounters:
    """Totals since the scheduler started. Every update returns a new object."""

    steps: int = 0
    steps_by_shape: Mapping[StepShape, int] = field(default_factory=lambda: _zeros(COUNTED_SHAPES))
    forwards_by_graph: Mapping[GraphKind, int] = field(default_factory=lambda: _zeros(tuple(GraphKind)))
    steps_over_budget: int = 0
    decode_rows: int = 0
    window_rows: int = 0
    padding_rows: int = 0
    enqueued: int = 0
    admitted: int = 0  # requests whose window completed (they joined the running batch)
    window_chunks: int = 0  # chunked windows: chunks that left part of a window waiting
    admitted_over_budget: int = 0
    finished: int = 0
    aborted_waiting: int = 0
    aborted_running: int = 0
    timed_out: int = 0

    def with_step(self, plan: StepPlan, graphs: Sequence[GraphChoice]) -> SchedulerCounters:
        if plan.shape is StepShape.IDLE:
            raise ValueError(f"step {plan.step} is idle: idle steps are not counted")
        by_shape = dict(self.steps_by_shape)
        by_shape[plan.shape] += 1
        by_graph = dict(self.forwards_by_graph)
        for g in graphs:
            by_graph[g.kind] += 1
        return replace(
            self,
            steps=self.steps + 1,
            steps_by_shape=by_shape,
            forwards_by_graph=by_graph,
            steps_over_budget=self.steps_over_budget + int(plan.exceeds_budget),
            decode_rows=self.decode_rows + plan.decode_rows,
            window_rows=self.window_rows + plan.window_rows,
            padding_rows=self.padding_rows + sum(g.padding_rows for g in graphs),
            admitted=self.admitted + len(plan.admitted) - len(plan.partial),
            window_chunks=self.window_chunks + len(plan.partial),
            admitted_over_budget=self.admitted_over_budget
            + sum(1 for d in plan.decisions if d.admitted and d.reason.over_budget),
        )

    def with_event(self, name: str) -> SchedulerCounters:
        """Count one request event: enqueued, finished, aborted_waiting, aborted_running or timed_out."""
        if name not in ("enqueued", "finished", "aborted_waiting", "aborted_running", "timed_out"):
            raise ValueError(f"unknown request event {name!r}")
        return replace(self, **{name: getattr(self, name) + 1})

    @property
    def forwards(self) -> int:
        return sum(self.forwards_by_graph.values())
