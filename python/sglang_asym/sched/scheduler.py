"""Scheduler: the decode worker's queues (waiting windows, running decodes) driven step by step by plan_step."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from enum import Enum

from .config import SchedulerConfig
from .counters import SchedulerCounters
from .explain import explain_decision, explain_step
from .graphs import GraphChoice, choose_graphs
from .plan import StepPlan, StepShape, plan_step
from .request_views import InvalidRequestError, RunningRequest, WaitingRequest, check_window_rows

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """enqueue() on a waiting queue that already holds max_waiting requests."""


class UnknownRequestError(LookupError):
    """finish()/abort() named a request the scheduler does not hold in the expected state."""


class RequestState(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"


@dataclass(frozen=True)
class ScheduledStep:
    """A planned step and the forwards (graph choices) that execute it, in order."""

    plan: StepPlan
    graphs: tuple[GraphChoice, ...]


@dataclass(frozen=True)
class WaitTimeout:
    """Error result: a waiting request removed because it waited longer than wait_timeout_s."""

    request_id: str
    waited_s: float
    waited_steps: int
    timeout_s: float
    queue_position: int  # 0 = it was the head

    @property
    def message(self) -> str:
        return (
            f"request {self.request_id!r} timed out waiting for its window step: waited {self.waited_s:.3f} s "
            f"> wait_timeout_s={self.timeout_s} ({self.waited_steps} steps, position {self.queue_position} in queue)"
        )


class Scheduler:
    """Holds the waiting queue (FIFO) and the running batch; step() plans, admits and counts one step."""

    def __init__(self, config: SchedulerConfig) -> None:
        if not isinstance(config, SchedulerConfig):
            raise TypeError(f"Scheduler needs a SchedulerConfig, got {type(config).__name__}")
        self.config = config
        self._waiting: dict[str, WaitingRequest] = {}  # insertion order is queue order
        self._running: dict[str, RunningRequest] = {}
        self._next_step = 0
        self._counters = SchedulerCounters()

    @property
    def next_step(self) -> int:
        return self._next_step

    @property
    def waiting(self) -> tuple[WaitingRequest, ...]:
        return tuple(self._waiting.values())

    @property
    def running(self) -> tuple[RunningRequest, ...]:
        return tuple(self._running.values())

    @property
    def counters(self) -> SchedulerCounters:
        return self._counters

    def enqueue(self, request_id: str, window_rows: int, arrival_time: float = 0.0) -> WaitingRequest:
        """Queue a request whose prefix state arrived; it may be admitted from the next step on."""
        if request_id in self._waiting or request_id in self._running:
            state = RequestState.WAITING if request_id in self._waiting else RequestState.RUNNING
            raise InvalidRequestError(f"request {request_id!r} is already {state.value}")
        if len(self._waiting) >= self.config.max_waiting:
            raise QueueFullError(
                f"cannot enqueue {request_id!r}: waiting queue is full (max_waiting={self.config.max_waiting})"
            )
        request = WaitingRequest(request_id, window_rows, self._next_step, arrival_time)
        check_window_rows(request, self.config)
        self._waiting[request_id] = request
        self._counters = self._counters.with_event("enqueued")
        logger.debug("enqueue %r: %d window rows, step %d, queue length %d",
                     request_id, window_rows, self._next_step, len(self._waiting))
        return request

    def add_running(self, request_id: str) -> RunningRequest:
        """Join a request whose first token was sampled elsewhere (symmetric PD: the prefill worker ran the
        whole prompt): it needs no window step and decodes from the next step on."""
        if request_id in self._waiting or request_id in self._running:
            state = RequestState.WAITING if request_id in self._waiting else RequestState.RUNNING
            raise InvalidRequestError(f"request {request_id!r} is already {state.value}")
        if len(self._running) >= self.config.max_running:
            raise QueueFullError(f"cannot add {request_id!r}: {len(self._running)} requests already running "
                                 f"(max_running={self.config.max_running})")
        request = self._running[request_id] = RunningRequest(request_id, self.config.verify_width)
        logger.debug("add running %r: %d running", request_id, len(self._running))
        return request

    def step(self) -> ScheduledStep | None:
        """Plan the next step, move admitted requests into the running batch; None when there is nothing to run."""
        waiting = self.waiting
        plan = plan_step(self.running, waiting, self._next_step, self.config)
        if plan.shape is StepShape.IDLE:
            return None
        graphs = choose_graphs(plan, self.config)
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
        self._counters = self._counters.with_step(plan, graphs)
        self._next_step += 1
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(explain_step(plan, graphs))
            for position, decision in enumerate(plan.decisions):
                logger.debug("step %d: %s", plan.step,
                             explain_decision(decision, self.config, len(waiting) - position - 1))
        return ScheduledStep(plan, graphs)

    def finish(self, request_id: str) -> None:
        """A running request finished decoding: free its slot."""
        if request_id not in self._running:
            where = "is still waiting (use abort)" if request_id in self._waiting else "is unknown"
            raise UnknownRequestError(f"cannot finish {request_id!r}: it {where}, not running")
        del self._running[request_id]
        self._counters = self._counters.with_event("finished")
        logger.debug("finish %r: %d running", request_id, len(self._running))

    def abort(self, request_id: str) -> RequestState:
        """Drop a request from whichever queue holds it; returns the state it was in."""
        if request_id in self._waiting:
            del self._waiting[request_id]
            self._counters = self._counters.with_event("aborted_waiting")
            state = RequestState.WAITING
        elif request_id in self._running:
            del self._running[request_id]
            self._counters = self._counters.with_event("aborted_running")
            state = RequestState.RUNNING
        else:
            raise UnknownRequestError(f"cannot abort {request_id!r}: it is neither waiting nor running")
        logger.debug("abort %r (was %s)", request_id, state.value)
        return state

    def expire(self, now: float) -> tuple[WaitTimeout, ...]:
        """Remove waiting requests that waited longer than wait_timeout_s at time `now` (caller's clock);
        a request whose window already ran a chunk is under way and is not timed out."""
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise ValueError(f"expire() needs a finite time, got {now!r}")
        timeout = self.config.wait_timeout_s
        if timeout is None:
            return ()
        expired = []
        for position, request in enumerate(self.waiting):
            waited = now - request.arrival_time
            if waited > timeout and request.last_chunk_step is None:  # a window already under way stays
                expired.append(WaitTimeout(request.request_id, waited, request.age(self._next_step), timeout, position))
        for result in expired:
            del self._waiting[result.request_id]
            self._counters = self._counters.with_event("timed_out")
            logger.debug(result.message)
        return tuple(expired)
