"""Scheduler: the decode worker's queues (waiting windows, running decodes) driven step by step by plan_step."""

from __future__ import annotations

import logging
from dataclasses import replace

from .config import SchedulerConfig
from .plan import StepPlan, StepShape, plan_step
from .request_views import InvalidRequestError, RunningRequest, WaitingRequest, check_window_rows

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """enqueue() on a waiting queue that already holds max_waiting requests."""


class UnknownRequestError(LookupError):
    """finish() named a request the scheduler does not hold as running."""


class Scheduler:
    """Holds the waiting queue (FIFO) and the running batch; step() plans and admits one step."""

    def __init__(self, config: SchedulerConfig) -> None:
        if not isinstance(config, SchedulerConfig):
            raise TypeError(f"Scheduler needs a SchedulerConfig, got {type(config).__name__}")
        self.config = config
        self._waiting: dict[str, WaitingRequest] = {}  # insertion order is queue order
        self._running: dict[str, RunningRequest] = {}
        self._next_step = 0

    @property
    def next_step(self) -> int:
        return self._next_step

    @property
    def waiting(self) -> tuple[WaitingRequest, ...]:
        return tuple(self._waiting.values())

    @property
    def running(self) -> tuple[RunningRequest, ...]:
        return tuple(self._running.values())

    def _check_new(self, request_id: str) -> None:
        if request_id in self._waiting or request_id in self._running:
            state = "waiting" if request_id in self._waiting else "running"
            raise InvalidRequestError(f"request {request_id!r} is already {state}")

    def enqueue(self, request_id: str, window_rows: int) -> WaitingRequest:
        """Queue a request whose prefix state arrived; it may be admitted from the next step on."""
        self._check_new(request_id)
        if len(self._waiting) >= self.config.max_waiting:
            raise QueueFullError(
                f"cannot enqueue {request_id!r}: waiting queue is full (max_waiting={self.config.max_waiting})"
            )
        request = WaitingRequest(request_id, window_rows, self._next_step)
        check_window_rows(request, self.config)
        self._waiting[request_id] = request
        logger.debug("enqueue %r: %d window rows, step %d, queue length %d",
                     request_id, window_rows, self._next_step, len(self._waiting))
        return request

    def add_running(self, request_id: str) -> RunningRequest:
        """Join a request whose first token was sampled elsewhere (symmetric PD: the prefill worker ran the
        whole prompt): it needs no window step and decodes from the next step on."""
        self._check_new(request_id)
        if len(self._running) >= self.config.max_running:
            raise QueueFullError(f"cannot add {request_id!r}: {len(self._running)} requests already running "
                                 f"(max_running={self.config.max_running})")
        request = self._running[request_id] = RunningRequest(request_id, self.config.verify_width)
        logger.debug("add running %r: %d running", request_id, len(self._running))
        return request

    def step(self) -> StepPlan | None:
        """Plan the next step, move admitted requests into the running batch; None when there is nothing to run."""
        plan = plan_step(self.running, self.waiting, self._next_step, self.config)
        if plan.shape is StepShape.IDLE:
            return None
        partial = set(plan.partial)
        for request in plan.admitted:
            rid = request.request_id
            if rid in partial:  # a chunk of its window ran: the rest waits at the same place in the queue
                left = self._waiting[rid].window_rows - request.window_rows
                self._waiting[rid] = replace(self._waiting[rid], window_rows=left, last_chunk_step=plan.step)
                continue
            del self._waiting[rid]
            # The window step samples the first token and the drafts: next step it verifies 1 + k rows.
            self._running[rid] = RunningRequest(rid, self.config.verify_width)
        self._next_step += 1
        logger.debug("step %d %s: decode %d rows, window %d rows", plan.step, plan.shape.value, plan.decode_rows,
                     plan.window_rows)
        return plan

    def finish(self, request_id: str) -> None:
        """A running request finished decoding: free its slot."""
        if request_id not in self._running:
            where = "is still waiting" if request_id in self._waiting else "is unknown"
            raise UnknownRequestError(f"cannot finish {request_id!r}: it {where}, not running")
        del self._running[request_id]
        logger.debug("finish %r: %d running", request_id, len(self._running))
