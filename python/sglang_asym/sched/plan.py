"""plan_step: the pure decision of which running requests decode and which waiting windows are admitted.

Budget policy, for one step:
  * every running request decodes (q_len rows each); decode is never starved;
  * the waiting queue is admitted as a FIFO prefix while each next window fits both the token budget
    (decode rows + window rows) and the window-row bound, and a running slot is free;
  * the queue head is admitted over the token budget (alone, so the step has exactly
    decode_rows + head.window_rows rows) when it has waited `max_wait_steps` steps, or when nothing is
    running (no inter-token latency to protect). The window-row bound is never exceeded: it is >= W.
So a request with p requests ahead of it at arrival is admitted at most max_wait_steps + p steps after
arrival, plus one step for every step in that span whose running batch had no free slot.

Chunked windows (config.window_chunk = c): a request may be admitted for a chunk of its window. Going
down the queue, each request gets min(rows left, c, budget left, window-row bound left) rows; if that is
all it has left it is admitted whole (FITS) and the next one is considered, otherwise it runs a CHUNK
and stays at its place in the queue, and admission stops there (so one request finishes its window
before the next starts); with config.deterministic a chunk is never cut below min(rows left, c) (it
waits instead), so a window's chunks are the same whatever else runs. A step never exceeds the token budget: with a free running slot at most
max_running - 1 requests decode, and the config guarantees token_budget >= max_running * (1 + k), so
the head always has at least 1 + k rows of budget and no aging is needed. A request's age restarts
after each chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Sequence

from .config import AdmitPolicy, SchedulerConfig
from .request_views import RunningRequest, WaitingRequest, check_step_inputs


class AdmitReason(str, Enum):
    """Why a waiting request was or was not admitted in a step."""

    FITS = "fits"  # within the remaining token budget and window-row bound
    CHUNK = "chunk"  # chunked windows: a part of the window within the budget; the rest keeps waiting
    AGED = "aged"  # head that waited max_wait_steps: admitted over the token budget
    NO_DECODE = "no_decode"  # head admitted over the token budget: no running request to slow down
    ADMIT_ALL = "admit_all"  # admit_all policy
    NO_SLOT = "no_slot"  # running batch full
    OVER_BUDGET = "over_budget"
    OVER_WINDOW_BOUND = "over_window_bound"

    @property
    def admits(self) -> bool:
        return self in (AdmitReason.FITS, AdmitReason.CHUNK, AdmitReason.AGED, AdmitReason.NO_DECODE,
                        AdmitReason.ADMIT_ALL)


class StepShape(str, Enum):
    """What rows a step holds."""

    IDLE = "idle"
    DECODE_ONLY = "decode_only"
    WINDOW_ONLY = "window_only"
    MIXED = "mixed"  # decode and window rows in one forward


@dataclass(frozen=True)
class AdmissionDecision:
    """One waiting request's outcome, with the room that was left when it was considered."""

    request_id: str
    window_rows: int
    age: int
    reason: AdmitReason
    budget_left: int  # token budget left before this request (negative after an over-budget admission)
    window_rows_left: int  # window-row bound left before this request
    free_slots: int  # running slots left before this request
    chunk_rows: int | None = None  # chunked windows: rows admitted this step (0 when held); None: unchunked

    @property
    def admitted(self) -> bool:
        return self.reason.admits

    @property
    def rows_admitted(self) -> int:
        if not self.admitted:
            return 0
        return self.window_rows if self.chunk_rows is None else self.chunk_rows

    @property
    def completes_window(self) -> bool:
        """Admitted with every row it had left: it joins the running batch after this step."""
        return self.admitted and self.rows_admitted == self.window_rows


@dataclass(frozen=True)
class StepPlan:
    """The decision for one step: all running requests decode, a FIFO prefix of the queue is admitted."""

    step: int
    token_budget: int
    decode: tuple[RunningRequest, ...]
    # The admitted requests as they run this step: window_rows is the rows of this step (a chunk of the
    # request's window when chunked windows admit only a part of it).
    admitted: tuple[WaitingRequest, ...]
    # One decision per admitted request, in order, then the decision that stopped admission (if any).
    decisions: tuple[AdmissionDecision, ...]

    @property
    def decode_rows(self) -> int:
        return sum(r.q_len for r in self.decode)

    @property
    def window_rows(self) -> int:
        return sum(w.window_rows for w in self.admitted)

    @property
    def total_rows(self) -> int:
        return self.decode_rows + self.window_rows

    @property
    def partial(self) -> tuple[str, ...]:
        """Requests admitted for a chunk of their window only: they stay in the waiting queue."""
        return tuple(d.request_id for d in self.decisions if d.admitted and not d.completes_window)

    @property
    def shape(self) -> StepShape:
        if not self.decode and not self.admitted:
            return StepShape.IDLE
        if not self.admitted:
            return StepShape.DECODE_ONLY
        if not self.decode:
            return StepShape.WINDOW_ONLY
        return StepShape.MIXED


def _budget_reason(index: int, request: WaitingRequest, step: int, budget_left: int, window_left: int,
                   has_decode: bool, config: SchedulerConfig) -> AdmitReason:
    fits_window = request.window_rows <= window_left
    if fits_window and request.window_rows <= budget_left:
        return AdmitReason.FITS
    if index == 0:  # the head always fits the window-row bound (bound >= W >= window_rows)
        if not has_decode:
            return AdmitReason.NO_DECODE
        if request.age(step) >= config.max_wait_steps:
            return AdmitReason.AGED
    return AdmitReason.OVER_WINDOW_BOUND if not fits_window else AdmitReason.OVER_BUDGET


def _chunk_decision(request: WaitingRequest, budget_left: int, window_left: int,
                    config: SchedulerConfig) -> tuple[AdmitReason, int]:
    """Chunked windows: (reason, rows admitted this step). Deterministic configs admit a whole chunk
    (min(rows left, window_chunk)) or nothing, so chunk boundaries do not depend on the load."""
    rows = min(request.window_rows, config.chunk_rows, budget_left, window_left)
    if config.deterministic and rows < min(request.window_rows, config.chunk_rows):
        rows = 0
    if rows == request.window_rows:
        return AdmitReason.FITS, rows
    if rows >= 1:
        return AdmitReason.CHUNK, rows
    return (AdmitReason.OVER_WINDOW_BOUND if window_left < 1 else AdmitReason.OVER_BUDGET), 0


@dataclass(frozen=True)
class _StepRoom:
    """What is left of a step while the queue is walked: token budget, window-row bound, running slots."""

    budget_left: int
    window_left: int
    free_slots: int

    @classmethod
    def opening(cls, decode: tuple[RunningRequest, ...], config: SchedulerConfig) -> _StepRoom:
        """The room once every running request has its decode rows."""
        return cls(config.token_budget - sum(r.q_len for r in decode), config.max_window_rows_per_step,
                   config.max_running - len(decode))

    def after(self, rows: int) -> _StepRoom:
        """The room after one more request is admitted with `rows` window rows."""
        return _StepRoom(self.budget_left - rows, self.window_left - rows, self.free_slots - 1)

    def decision(self, request: WaitingRequest, step: int, reason: AdmitReason,
                 chunk_rows: int | None = None) -> AdmissionDecision:
        return AdmissionDecision(request.request_id, request.window_rows, request.age(step), reason,
                                 self.budget_left, self.window_left, self.free_slots, chunk_rows=chunk_rows)


def plan_step(
    running: Sequence[RunningRequest], waiting: Sequence[WaitingRequest], step: int, config: SchedulerConfig
) -> StepPlan:
    """Plan step `step` from the running requests and the waiting queue (oldest first)."""
    check_step_inputs(running, waiting, step, config)
    decode = tuple(running)
    room = _StepRoom.opening(decode, config)
    if config.window_chunk is not None and config.policy is AdmitPolicy.BUDGET:
        return _plan_chunked(decode, room, waiting, step, config)
    admitted: list[WaitingRequest] = []
    decisions: list[AdmissionDecision] = []
    for index, request in enumerate(waiting):
        if room.free_slots == 0:
            reason = AdmitReason.NO_SLOT
        elif config.policy is AdmitPolicy.ADMIT_ALL:
            reason = AdmitReason.ADMIT_ALL
        else:
            reason = _budget_reason(index, request, step, room.budget_left, room.window_left, bool(decode), config)
        decisions.append(room.decision(request, step, reason))
        if not reason.admits:
            break  # FIFO: nobody overtakes the first request that cannot go
        admitted.append(request)
        room = room.after(request.window_rows)
    return StepPlan(step, config.token_budget, decode, tuple(admitted), tuple(decisions))


def _plan_chunked(decode: tuple[RunningRequest, ...], room: _StepRoom, waiting: Sequence[WaitingRequest],
                  step: int, config: SchedulerConfig) -> StepPlan:
    admitted: list[WaitingRequest] = []
    decisions: list[AdmissionDecision] = []
    for request in waiting:
        if room.free_slots == 0:
            reason, rows = AdmitReason.NO_SLOT, 0
        else:
            reason, rows = _chunk_decision(request, room.budget_left, room.window_left, config)
        decisions.append(room.decision(request, step, reason, chunk_rows=rows))
        if not reason.admits:
            break
        admitted.append(replace(request, window_rows=rows))
        room = room.after(rows)
        if rows < request.window_rows:
            break  # its rest waits at its place: nobody behind it starts a window this step
    return StepPlan(step, config.token_budget, decode, tuple(admitted), tuple(decisions))
