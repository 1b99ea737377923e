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

from ...asym import PrefixState, install_prefix
from ...cache import CacheSet, OutOfPages, RequestCache
from ...model import V41Model
from ...sched import Scheduler, SchedulerConfig, StepMode
from ...split import SplitPlan
from ..engine_api import FinishReason, SamplingParams, TokenEvent
from .sampler import make_generator, sample

logger = logging.getLogger(__name__)

EmitFn = Callable[[TokenEvent], None]
_CHUNK_MARK = "@window-chunk-"  # scheduler ids of a request's non-final window chunks: rid + mark + offset


def _owner(scheduler_id: str) -> str:
    return scheduler_id.split(_CHUNK_MARK, 1)[0]


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
    window_done: int = 0  # window rows [B, B + window_done) already computed (chunked windows)
    queued_chunk: str | None = None  # scheduler id of the window chunk this request waits with


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
                 eos_token_id: int, on_step: Callable[[StepRecord], None] | None = None,
                 window_chunk: int | None = None) -> None:
        if sched_config.num_draft_tokens:
            raise ValueError("the decode loop runs plain decode; set num_draft_tokens=0 (speculative decoding "
                             "is driven by the speculative runner)")
        self.model, self.cache_set, self.eos = model, cache_set, eos_token_id
        self.scheduler = Scheduler(sched_config)
        # A window larger than this runs over several steps (bounded prefill per step protects ITL).
        self.window_chunk = sched_config.window if window_chunk is None else window_chunk
        if not 1 <= self.window_chunk <= sched_config.window:
            raise ValueError(f"window chunk must be in [1, {sched_config.window}], got {self.window_chunk}")
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
            decoding = [self._requests[r.request_id] for r in plan.decode
                        if r.request_id in self._requests and self._requests[r.request_id].next_input is not None]
            admitted = [(self._requests[_owner(w.request_id)], w) for w in plan.admitted
                        if _owner(w.request_id) in self._requests]
            pending: list[tuple[EmitFn, TokenEvent]] = []
            for req in decoding:
                pending += self._decode_one(req)
            if plan.mode is StepMode.SEPARATE:
                self._flush(pending)
                pending = []
            for req, chunk in admitted:
                pending += self._window(req, chunk.request_id, chunk.window_rows)
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
        if req.prompt.numel() != req.split.prompt_len:
            req.emit(TokenEvent(req.rid, (), True, FinishReason.abort("bad request"),
                                error=f"prompt has {req.prompt.numel()} tokens, its split is for {req.split.prompt_len}"))
            return
        self._seed += 1
        req.generator = make_generator(req.sampling, self._seed)
        self._requests[req.rid] = req
        self._enqueue_next_chunk(req)

    def _enqueue_next_chunk(self, req: ActiveRequest) -> None:
        """Queue the request's next window chunk; the last chunk carries the request's own id so the
        scheduler keeps it running afterwards."""
        left = req.split.prompt_len - req.split.boundary - req.window_done
        rows = min(left, self.window_chunk)
        chunk_id = req.rid if rows == left else f"{req.rid}{_CHUNK_MARK}{req.window_done}"
        req.queued_chunk = chunk_id
        self.scheduler.enqueue(chunk_id, rows, arrival_time=req.arrival)

    def _window(self, req: ActiveRequest, chunk_id: str, rows: int) -> list[tuple[EmitFn, TokenEvent]]:
        final = chunk_id == req.rid
        req.queued_chunk = None
        try:
            if req.cache is None:
                req.cache = install_prefix(self.model, self.cache_set, req.prefix, req.split)
            start = req.split.boundary + req.window_done
            logits = self.model(req.prompt[start : start + rows], req.cache, logits="last" if final else "none")
            req.window_done += rows
        except OutOfPages as exc:
            return [self._finish(req, None, error=f"decode worker out of cache pages: {exc}")]
        except Exception as exc:  # a bad prefix state or a model error ends this request only
            logger.exception("window step of %s failed", req.rid)
            return [self._finish(req, None, error=f"window step failed: {exc}")]
        if not final:
            self.scheduler.finish(chunk_id)  # a partial window holds no decode slot
            self._enqueue_next_chunk(req)
            return []
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
        for sched_id in {req.rid, req.queued_chunk} - {None}:
            try:
                self.scheduler.abort(sched_id)
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
