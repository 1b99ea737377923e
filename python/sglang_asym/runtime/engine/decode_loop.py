"""The decode worker's model loop: one thread owns the full model and its caches, asks the step
scheduler what to run, executes window steps (the last W prompt tokens over a transferred prefix)
and decode steps, samples, and hands token events back to the asyncio side.

Step semantics follow a GPU forward: in a mixed step every token of the step is emitted when the
whole step is done; in separate mode the decode forward's tokens go out before the window forward."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ...asym import PrefixState, run_window
from ...cache import CacheSet, OutOfPages, RequestCache
from ...model import V41Model
from ...sched import Scheduler, SchedulerConfig, StepMode
from ...split import SplitPlan
from ..engine_api import FinishReason, SamplingParams, TokenEvent
from .sampler import make_generator, sample

logger = logging.getLogger(__name__)

EmitFn = Callable[[TokenEvent], None]


@dataclass
class ActiveRequest:
    rid: str
    prompt: torch.Tensor
    split: SplitPlan
    prefix: PrefixState
    sampling: SamplingParams
    emit: EmitFn
    arrival: float = field(default_factory=time.monotonic)
    cache: RequestCache | None = None
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    next_input: int | None = None  # the last sampled token, fed at the next decode step


@dataclass(frozen=True)
class StepRecord:
    """What one scheduler step ran: for benchmarks and /metrics."""

    step: int
    shape: str
    decode_rows: int
    window_rows: int
    seconds: float


class DecodeLoop:
    def __init__(self, model: V41Model, cache_set: CacheSet, sched_config: SchedulerConfig,
                 eos_token_id: int, on_step: Callable[[StepRecord], None] | None = None) -> None:
        if sched_config.num_draft_tokens:
            raise ValueError("the decode loop runs plain decode; set num_draft_tokens=0 (speculative decoding "
                             "is driven by the speculative runner)")
        self.model, self.cache_set, self.eos = model, cache_set, eos_token_id
        self.scheduler = Scheduler(sched_config)
        self.on_step = on_step
        self._inbox: queue.Queue = queue.Queue()
        self._requests: dict[str, ActiveRequest] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="decode-loop", daemon=True)
        self._seed = 0

    # ---- control (any thread) -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout)

    def submit(self, request: ActiveRequest) -> None:
        self._inbox.put(("add", request))

    def abort(self, rid: str, reason: str = "Aborted") -> None:
        self._inbox.put(("abort", (rid, reason)))

    @property
    def active_requests(self) -> int:
        return len(self._requests)

    # ---- loop thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox(block=not self._requests)
            if self._stop.is_set():
                break
            step = self.scheduler.step()
            if step is None:
                continue
            t0 = time.perf_counter()
            plan = step.plan
            decoding = [self._requests[r.request_id] for r in plan.decode if r.request_id in self._requests]
            admitted = [self._requests[w.request_id] for w in plan.admitted if w.request_id in self._requests]
            pending: list[tuple[EmitFn, TokenEvent]] = []
            for req in decoding:
                pending += self._decode_one(req)
            if plan.mode is StepMode.SEPARATE:
                self._flush(pending)
                pending = []
            for req in admitted:
                pending += self._window(req)
            self._flush(pending)
            if self.on_step is not None:
                self.on_step(StepRecord(plan.step, plan.shape.value, plan.decode_rows, plan.window_rows,
                                        time.perf_counter() - t0))
        self._flush([self._finish(req, None, error="decode worker stopped") for req in list(self._requests.values())])

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = item
            if kind == "add":
                self._add(payload)
            elif kind == "abort":
                rid, reason = payload
                req = self._requests.get(rid)
                if req is not None:
                    self._flush([self._finish(req, FinishReason.abort(reason))])
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, req: ActiveRequest) -> None:
        if req.rid in self._requests:
            req.emit(TokenEvent(req.rid, (), True, FinishReason.abort("duplicate request id"),
                                error=f"request id {req.rid!r} is already running"))
            return
        if req.sampling.max_new_tokens == 0:
            req.emit(TokenEvent(req.rid, (), True, FinishReason.of_length(0)))
            return
        self._seed += 1
        req.generator = make_generator(req.sampling, self._seed)
        self._requests[req.rid] = req
        window_rows = req.split.prompt_len - req.split.boundary
        self.scheduler.enqueue(req.rid, window_rows, arrival_time=req.arrival)

    def _window(self, req: ActiveRequest) -> list[tuple[EmitFn, TokenEvent]]:
        try:
            logits, req.cache = run_window(self.model, self.cache_set, req.prefix, req.prompt, req.split)
        except OutOfPages as exc:
            return [self._finish(req, None, error=f"decode worker out of cache pages: {exc}")]
        except Exception as exc:  # a bad prefix state or a model error ends this request only
            logger.exception("window step of %s failed", req.rid)
            return [self._finish(req, None, error=f"window step failed: {exc}")]
        return [self._accept_token(req, logits)]

    def _decode_one(self, req: ActiveRequest) -> list[tuple[EmitFn, TokenEvent]]:
        try:
            logits = self.model(torch.tensor([req.next_input]), req.cache, logits="last")
        except OutOfPages as exc:
            return [self._finish(req, None, error=f"decode worker out of cache pages: {exc}")]
        return [self._accept_token(req, logits)]

    def _accept_token(self, req: ActiveRequest, logits: torch.Tensor) -> tuple[EmitFn, TokenEvent]:
        token = sample(logits, req.sampling, req.generator)
        req.generated.append(token)
        req.next_input = token
        params = req.sampling
        if (token == self.eos and not params.ignore_eos) or token in params.stop_token_ids:
            return self._finish(req, FinishReason.stop(token), last=(token,))
        if len(req.generated) >= params.max_new_tokens or \
                req.cache.pos + 1 >= self.model.cfg.max_position_embeddings:
            return self._finish(req, FinishReason.of_length(len(req.generated)), last=(token,))
        return req.emit, TokenEvent(req.rid, (token,))

    def _finish(self, req: ActiveRequest, reason: FinishReason | None, last: tuple[int, ...] = (),
                error: str | None = None) -> tuple[EmitFn, TokenEvent]:
        """Remove the request everywhere and free its cache; returns its final event (not yet emitted)."""
        self._requests.pop(req.rid, None)
        try:
            self.scheduler.abort(req.rid)
        except LookupError:
            pass
        if req.cache is not None:
            req.cache.release()
            req.cache = None
        if reason is None:
            reason = FinishReason.abort(error or "Aborted")
        return req.emit, TokenEvent(req.rid, last, True, reason, error=error)

    @staticmethod
    def _flush(events: list[tuple[EmitFn, TokenEvent]]) -> None:
        for emit, event in events:
            try:
                emit(event)
            except Exception:  # a broken consumer must never stop the loop that serves everyone else
                logger.exception("could not deliver an event of %s", event.rid)
