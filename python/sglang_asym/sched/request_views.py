"""The request views the step scheduler sees: running decode requests and waiting window requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .config import SchedulerConfig


class InvalidRequestError(ValueError):
    """A request view the scheduler cannot accept (bad row count, duplicate id, ...)."""


def _check_id(kind: str, request_id: object) -> None:
    if not isinstance(request_id, str) or not request_id:
        raise InvalidRequestError(f"{kind} needs a non-empty str request_id, got {request_id!r}")


@dataclass(frozen=True)
class RunningRequest:
    """A request past its window step: each step it verifies `q_len` rows (1 + k draft tokens)."""

    request_id: str
    q_len: int

    def __post_init__(self) -> None:
        _check_id("RunningRequest", self.request_id)
        if isinstance(self.q_len, bool) or not isinstance(self.q_len, int) or self.q_len < 1:
            raise InvalidRequestError(f"running request {self.request_id!r}: q_len must be an int >= 1, got {self.q_len!r}")


@dataclass(frozen=True)
class WaitingRequest:
    """A request whose prefix state has arrived; it needs one window step of `window_rows` prompt rows."""

    request_id: str
    window_rows: int
    arrival_step: int  # index of the first step it could have been admitted in
    # Chunked windows: the step that ran this request's latest chunk (window_rows is what is left).
    last_chunk_step: int | None = None

    def __post_init__(self) -> None:
        _check_id("WaitingRequest", self.request_id)
        if isinstance(self.window_rows, bool) or not isinstance(self.window_rows, int):
            raise InvalidRequestError(
                f"waiting request {self.request_id!r}: window_rows must be an int, got {self.window_rows!r}"
            )
        if self.window_rows < 1:
            raise InvalidRequestError(
                f"waiting request {self.request_id!r}: window_rows must be >= 1, got {self.window_rows}"
            )
        if isinstance(self.arrival_step, bool) or not isinstance(self.arrival_step, int) or self.arrival_step < 0:
            raise InvalidRequestError(
                f"waiting request {self.request_id!r}: arrival_step must be an int >= 0, got {self.arrival_step!r}"
            )
        c = self.last_chunk_step
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < self.arrival_step):
            raise InvalidRequestError(
                f"waiting request {self.request_id!r}: last_chunk_step must be None or an int >= arrival_step, got {c!r}"
            )

    def age(self, step: int) -> int:
        """Steps this request has been passed over when `step` is planned (since its latest chunk, if any)."""
        return step - (self.arrival_step if self.last_chunk_step is None else self.last_chunk_step + 1)


def check_window_rows(request: WaitingRequest, config: SchedulerConfig) -> None:
    """Raise InvalidRequestError unless 1 <= window_rows <= W."""
    if request.window_rows > config.window:
        raise InvalidRequestError(
            f"waiting request {request.request_id!r}: window_rows={request.window_rows} exceeds the "
            f"window W={config.window}; the prefill worker must ship all but the last W prompt tokens"
        )


def check_step_inputs(
    running: Sequence[RunningRequest], waiting: Sequence[WaitingRequest], step: int, config: SchedulerConfig
) -> None:
    """Raise a clear error if the views handed to plan_step are inconsistent with each other or the config."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if len(running) > config.max_running:
        raise InvalidRequestError(f"{len(running)} running requests exceed max_running={config.max_running}")
    seen: set[str] = set()
    for r in running:
        if not isinstance(r, RunningRequest):
            raise TypeError(f"running holds a {type(r).__name__}, expected RunningRequest")
        if r.q_len > config.verify_width:
            raise InvalidRequestError(
                f"running request {r.request_id!r}: q_len={r.q_len} exceeds the verify width "
                f"1 + num_draft_tokens = {config.verify_width}"
            )
        if r.request_id in seen:
            raise InvalidRequestError(f"request id {r.request_id!r} appears twice among running requests")
        seen.add(r.request_id)
    previous_arrival = 0
    for w in waiting:
        if not isinstance(w, WaitingRequest):
            raise TypeError(f"waiting holds a {type(w).__name__}, expected WaitingRequest")
        check_window_rows(w, config)
        # Aging bounds the wait only if everyone ahead in the queue is at least as old.
        if w.arrival_step < previous_arrival:
            raise InvalidRequestError(
                f"waiting queue is not in arrival order: {w.request_id!r} (step {w.arrival_step}) "
                f"queued behind a request that arrived at step {previous_arrival}"
            )
        previous_arrival = w.arrival_step
        if w.arrival_step > step:
            raise InvalidRequestError(
                f"waiting request {w.request_id!r} arrives at step {w.arrival_step}, after the planned step {step}"
            )
        if w.last_chunk_step is not None and (config.window_chunk is None or w.last_chunk_step >= step):
            raise InvalidRequestError(
                f"waiting request {w.request_id!r} ran a window chunk at step {w.last_chunk_step}, but the planned "
                f"step is {step}" + ("" if config.window_chunk is not None else " and windows are not chunked")
            )
        if w.request_id in seen:
            raise InvalidRequestError(f"request id {w.request_id!r} appears twice among running/waiting requests")
        seen.add(w.request_id)
