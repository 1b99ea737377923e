"""The decode worker's model loop: one thread owns the full model and its caches, asks the step
scheduler what to run, executes window steps (the last W prompt tokens over a transferred prefix)
and decode steps, samples, and hands token events back to the asyncio side.

Every forward is ONE batched pass of the model runner (`model.graph_runner.GraphRunner`) over the rows
of all requests in it: the decode (or speculative verify) rows of every running request and the window
rows admitted this step, at the graph shapes the scheduler chose with the step (`ScheduledStep.graphs`)
(FULL decode bucket x (1 + k), ROW_BUCKET window, BREAKABLE / EAGER mixed); on CPU the same shape
decisions run eagerly. With `model.deterministic` (--enable-deterministic-inference) each request's rows
run as a forward of their own instead, so its tokens do not depend on the batch. Step semantics follow a GPU forward: in a mixed step every token of the step is
emitted when the whole step is done; in separate mode the decode forward's tokens go out before the window
forward runs. Windows may run in chunks (the scheduler sizes them to the token budget).

With a drafter and num_draft_tokens k > 0, a request that has its first token decodes speculatively:
the drafter proposes up to k tokens, the step verifies [anchor, drafts] (q_len 1 + k) in the batched
forward, the accepted tokens (greedy, or the speculative sampling rule) are all emitted, and the
rejected rows are rolled back in the cache and the drafter state (`sglang_asym.speculative`)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ...asym import PrefixState, install_prefix
from ...cache import CacheSet, OutOfPages, RequestCache
from ...model import V41Model
from ...model.graph_runner import Backend, GraphRunner, RowKind, RunnerStats, StepFailed, StepRows, forward_kind
from ...model.model import SegmentInput, SegmentOutput
from ...sched import GraphChoice, Scheduler, SchedulerConfig, StepMode
from ...speculative import (AcceptanceStats, Drafter, SpecRequest, accept, check_draft_len, commit,
                            drafter_from_checkpoint, propose)
from ...split import SplitPlan
from ..engine_api import FinishReason, SamplingParams, TokenEvent
from .sampler import make_generator, sample

logger = logging.getLogger(__name__)

EmitFn = Callable[[TokenEvent], None]
Emission = tuple[EmitFn, TokenEvent]


@dataclass
class ActiveRequest:
    rid: str
    prompt: torch.Tensor
    split: SplitPlan
    prefix: PrefixState | None  # None for a request joined already running (submit_running)
    sampling: SamplingParams
    emit: EmitFn
    arrival: float = field(default_factory=time.monotonic)
    cache: RequestCache | None = None
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    next_input: int | None = None  # the last sampled token, fed at the next decode step
    window_done: int = 0  # window rows [B, B + window_done) already computed (chunked windows)
    draft_state: Any = None  # the drafter's context of this request (speculative decoding only)
    spec: SpecRequest | None = None  # speculative decode state once the request has a token to draft from


# ---- the inbox: what other threads post to the loop thread ----------------------------------------
@dataclass(frozen=True)
class Wake:
    """Nothing to do but look at the stop flag (stop() posts it so a blocked drain returns)."""


@dataclass(frozen=True)
class Submit:
    """A request whose window runs here (its prefix state arrived or it has none)."""

    request: ActiveRequest


@dataclass(frozen=True)
class Abort:
    """End a request (if still here) with FinishReason.abort(reason)."""

    rid: str
    reason: str


@dataclass(frozen=True)
class Join:
    """A request whose whole prompt ran elsewhere: `install` builds its cache on the loop thread and
    `first_token` is emitted at once."""

    request: ActiveRequest
    first_token: int
    install: Callable[[CacheSet], RequestCache]


InboxMessage = Wake | Submit | Abort | Join


@dataclass(frozen=True)
class StepRecord:
    """What one scheduler step ran: for benchmarks and /metrics."""

    step: int
    shape: str
    decode_rows: int
    window_rows: int
    seconds: float
    proposed: int = 0  # draft tokens proposed this step (speculative decoding)
    accepted: int = 0  # of those, accepted by the target
    emitted: int = 0  # tokens the step's decode rows emitted (accepted drafts + one per verify)
    graphs: tuple[str, ...] = ()  # graph kind of each batched forward, in order (reruns after a failure left out)


@dataclass
class _Work:
    """One request's rows in a forward and what to do with the result."""

    req: ActiveRequest
    tokens: torch.Tensor
    logits: str
    start: int  # the request's cache position before the forward
    capture: tuple[int, ...] = ()
    window: bool = False
    final: bool = False  # window: its last chunk (the first token is sampled from it)
    draft: Any = None  # speculative verify: the Draft checked by these rows
    draft_probs: torch.Tensor | None = None  # sampled drafts: the distributions they were drawn from

    @property
    def input(self) -> SegmentInput:
        return SegmentInput(self.tokens, self.req.cache, self.logits, self.capture)

    @property
    def rows(self) -> StepRows:
        return StepRows(self.req.cache, self.tokens, RowKind.WINDOW if self.window else RowKind.DECODE, self.logits)


@dataclass
class _StepTally:
    spec: AcceptanceStats = field(default_factory=AcceptanceStats)  # the step's speculative verifies
    plain_tokens: int = 0  # tokens of plain (non-speculative) decode rows
    graphs: list[str] = field(default_factory=list)  # graph kind of each batched forward


def load_drafter(model: V41Model, model_path: str, num_draft_tokens: int) -> Drafter | None:
    """The checkpoint's DSpark drafter when speculative decoding is on (k > 0), else None."""
    return drafter_from_checkpoint(model, model_path) if num_draft_tokens else None


class DecodeLoop:
    def __init__(self, model: V41Model, cache_set: CacheSet, sched_config: SchedulerConfig,
                 eos_token_id: int, on_step: Callable[[StepRecord], None] | None = None,
                 window_chunk: int | None = None, drafter: Drafter | None = None,
                 graph_backend: str = "auto", warm_up_graphs: bool | None = None) -> None:
        """`window_chunk` (if given) overrides sched_config.window_chunk: a window runs over several steps,
        at most that many rows per step. With sched_config.num_draft_tokens k > 0 a drafter is required
        and requests decode speculatively with up to k drafts per step. `graph_backend` is the model
        runner's backend: 'auto' (CUDA graphs on a CUDA model, else eager), 'eager', 'cuda_graph',
        'emulated_graph'. `warm_up_graphs` captures the whole-forward graphs in `start()`, before any
        request (default: with CUDA graphs only; the emulated ones are a CPU check)."""
        if window_chunk is not None:
            sched_config = replace(sched_config, window_chunk=window_chunk)
        if model.deterministic and not sched_config.deterministic:  # fixed window chunks go with it
            sched_config = replace(sched_config, deterministic=True)
        self.num_draft_tokens = sched_config.num_draft_tokens
        if self.num_draft_tokens:
            if drafter is None:
                raise ValueError(f"num_draft_tokens={self.num_draft_tokens} needs a drafter (speculative decoding); "
                                 "set it to 0 for plain decoding")
            check_draft_len(self.num_draft_tokens, drafter)
        self.drafter = drafter if self.num_draft_tokens else None
        self._features = self.drafter.feature_layers if self.drafter is not None else ()
        self.model, self.cache_set, self.eos = model, cache_set, eos_token_id
        self.scheduler = Scheduler(sched_config)
        self.sched_config = sched_config
        self.runner = GraphRunner(model, sched_config, backend=graph_backend)
        self.warm_up_graphs = (self.runner.backend is Backend.CUDA_GRAPH) if warm_up_graphs is None else warm_up_graphs
        self._graph_stats = self.runner.stats()
        self.window_chunk = sched_config.chunk_rows
        self.on_step = on_step
        self._inbox: queue.Queue[InboxMessage] = queue.Queue()
        self._requests: dict[str, ActiveRequest] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="decode-loop", daemon=True)
        self._seed = 0
        self._acceptance = AcceptanceStats()
        self._stats_lock = threading.Lock()

    # ---- control (any thread) -------------------------------------------------------------
    def start(self) -> None:
        if self.warm_up_graphs:
            t0 = time.perf_counter()
            captured = self.runner.warm_up(self.cache_set, self.sched_config.max_running, self._features)
            with self._stats_lock:
                self._graph_stats = self.runner.stats()
            logger.info("captured %d whole-forward graphs in %.1f s before serving", captured,
                        time.perf_counter() - t0)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(Wake())
        self._thread.join(timeout)

    def submit(self, request: ActiveRequest) -> None:
        self._inbox.put(Submit(request))

    def abort(self, rid: str, reason: str = "Aborted") -> None:
        self._inbox.put(Abort(rid, reason))

    def submit_running(self, request: ActiveRequest, first_token: int,
                       install: Callable[[CacheSet], RequestCache]) -> None:
        """Join a request whose whole prompt ran elsewhere (symmetric PD's prefill worker, a colocated
        exact prefill): `install` builds its cache on the loop thread, `first_token` is emitted at once
        and fed to its first decode step, `request.generator` continues the first token's RNG stream."""
        self._inbox.put(Join(request, first_token, install))

    @property
    def active_requests(self) -> int:
        return len(self._requests)

    @property
    def acceptance(self) -> AcceptanceStats:
        """Speculative decoding totals so far (steps, proposed, accepted, emitted; a copy)."""
        copy = AcceptanceStats()
        with self._stats_lock:
            copy.merge(self._acceptance)
        return copy

    @property
    def graph_stats(self) -> RunnerStats:
        """The model runner's totals after the last step: forwards by graph kind, padding, replays."""
        with self._stats_lock:
            return self._graph_stats

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
            events: list[Emission] = []
            planned = step.graphs  # the scheduler chose each forward's graph shape with the plan
            decode = self._decode_work(plan, events)
            windows = self._window_work(plan, events)
            stats = _StepTally()
            if plan.mode is StepMode.SEPARATE:
                events += self._execute(decode, stats, planned)
                self._flush(events)
                events = self._execute(windows, stats, planned)
            else:
                events += self._execute(decode + windows, stats, planned)
            self._flush(events)
            with self._stats_lock:
                if stats.spec.steps:
                    self._acceptance.merge(stats.spec)
                self._graph_stats = self.runner.stats()
            if self.on_step is not None:
                self.on_step(StepRecord(plan.step, plan.shape.value, plan.decode_rows, plan.window_rows,
                                        time.perf_counter() - t0, stats.spec.proposed, stats.spec.accepted,
                                        stats.spec.emitted + stats.plain_tokens, tuple(stats.graphs)))
        self._flush([self._finish(req, None, error="decode worker stopped") for req in list(self._requests.values())])

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            match item:
                case Submit(request):
                    self._add(request)
                case Abort(rid, reason):
                    req = self._requests.get(rid)
                    if req is not None:
                        self._flush([self._finish(req, FinishReason.abort(reason))])
                case Join(request, first_token, install):
                    self._join(request, first_token, install)
                case Wake():
                    pass
                case _:
                    raise TypeError(f"the decode loop's inbox got {item!r}, not an InboxMessage")
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _refuse_early(self, req: ActiveRequest) -> bool:
        """End a request that needs no step (a known id, no token wanted) with its final event; True if so."""
        if req.rid in self._requests:
            self._flush([(req.emit, TokenEvent(req.rid, (), True, FinishReason.abort("duplicate request id"),
                                               error=f"request id {req.rid!r} is already running"))])
            return True
        if req.sampling.max_new_tokens == 0:
            self._flush([(req.emit, TokenEvent(req.rid, (), True, FinishReason.of_length(0)))])
            return True
        return False

    def _add(self, req: ActiveRequest) -> None:
        if self._refuse_early(req):
            return
        if req.prompt.numel() != req.split.prompt_len:
            req.emit(TokenEvent(req.rid, (), True, FinishReason.abort("bad request"),
                                error=f"prompt has {req.prompt.numel()} tokens, its split is for {req.split.prompt_len}"))
            return
        self._seed += 1
        req.generator = make_generator(req.sampling, self._seed)
        try:
            self.scheduler.enqueue(req.rid, req.split.prompt_len - req.split.boundary, arrival_time=req.arrival)
        except Exception as exc:  # a full queue, a window over W: this request only
            req.emit(TokenEvent(req.rid, (), True, FinishReason.abort("bad request"), error=str(exc)))
            return
        self._requests[req.rid] = req

    def _join(self, req: ActiveRequest, first_token: int, install: Callable[[CacheSet], RequestCache]) -> None:
        if self._refuse_early(req):
            return
        try:
            req.cache = install(self.cache_set)
            self._requests[req.rid] = req
            self.scheduler.add_running(req.rid)
        except Exception as exc:  # out of pages, a full batch, a bad state: this request only
            logger.warning("cannot join %s to the decode batch: %s", req.rid, exc)
            self._flush([self._finish(req, None, error=f"cannot join the decode batch: {exc}")])
            return
        self._flush([self._take_token(req, first_token)])

    # ---- one step: what each request runs ----------------------------------------------------------
    def _decode_work(self, plan, events: list[Emission]) -> list[_Work]:
        """The decode rows of the running requests: 1 token, or [anchor, drafts] when speculating."""
        work = []
        for running in plan.decode:
            req = self._requests.get(running.request_id)
            if req is None or req.next_input is None or req.cache is None:
                continue
            start = req.cache.pos
            k = self._draft_len(req) if req.spec is not None else 0
            if k:
                try:
                    draft, probs = propose(self.drafter, req.spec, k, req.sampling.token_sampling, req.generator)
                except Exception as exc:  # a drafter failure ends this request only
                    logger.exception("drafting for %s failed", req.rid)
                    events.append(self._finish(req, None, error=f"drafting failed: {exc}"))
                    continue
                tokens = torch.tensor([req.next_input, *draft.tokens], dtype=torch.long)
                work.append(_Work(req, tokens, "all", start, self._features, draft=draft, draft_probs=probs))
            else:
                work.append(_Work(req, torch.tensor([req.next_input], dtype=torch.long), "last", start, self._features))
        return work

    def _draft_len(self, req: ActiveRequest) -> int:
        """Drafts this step: k, fewer near max_new_tokens (no token is verified that could not be emitted)
        or the end of the context."""
        left = req.sampling.max_new_tokens - len(req.generated)
        room = self.model.cfg.max_position_embeddings - req.cache.pos - 1
        return max(0, min(self.num_draft_tokens, left - 1, room))

    def _window_work(self, plan, events: list[Emission]) -> list[_Work]:
        """The window rows admitted this step: a chunk of a request's [B, N), or all of it."""
        partial = set(plan.partial)
        work = []
        for piece in plan.admitted:
            req = self._requests.get(piece.request_id)
            if req is None:
                continue
            try:
                if req.cache is None:
                    req.cache = install_prefix(self.model, self.cache_set, req.prefix, req.split)
            except OutOfPages as exc:
                events.append(self._finish(req, None, error=f"decode worker out of cache pages: {exc}"))
                continue
            except Exception as exc:  # a bad prefix state ends this request only
                logger.exception("installing the prefix of %s failed", req.rid)
                events.append(self._finish(req, None, error=f"window step failed: {exc}"))
                continue
            first = req.split.boundary + req.window_done
            final = piece.request_id not in partial
            work.append(_Work(req, req.prompt[first : first + piece.window_rows], "last" if final else "none",
                              req.cache.pos, self._features, window=True, final=final))
        return work

    # ---- one step: running it -------------------------------------------------------------------------
    def _execute(self, work: list[_Work], stats: _StepTally, planned: tuple[GraphChoice, ...]) -> list[Emission]:
        if not work:
            return []
        events: list[Emission] = []
        if self.model.deterministic:  # each request alone: its logits do not depend on the batch
            outputs = [self._forward([item], planned, stats)[0] for item in work]
        else:
            outputs = self._forward(work, planned, stats)
        for item, out in zip(work, outputs):
            if item.req.rid not in self._requests:
                continue
            if isinstance(out, Exception):
                kind = "window step" if item.window else "decode step"
                if isinstance(out, OutOfPages):
                    events.append(self._finish(item.req, None, error=f"decode worker out of cache pages: {out}"))
                else:
                    events.append(self._finish(item.req, None, error=f"{kind} failed: {out}"))
                continue
            try:
                events.append(self._window_done(item, out) if item.window else self._decoded(item, out, stats))
            except Exception as exc:  # sampling or drafter bookkeeping failed: this request only
                logger.exception("step of %s failed", item.req.rid)
                events.append(self._finish(item.req, None, error=f"step failed: {exc}"))
        return [e for e in events if e is not None]

    def _forward(self, work: list[_Work], planned: tuple[GraphChoice, ...],
                 stats: _StepTally) -> list[SegmentOutput | Exception]:
        """One batched forward. An input the model refuses before touching any cache fails alone and the
        rest runs. If the forward fails midway, each request is restored and run alone, so only a
        request that fails on its own is lost."""
        results: list[SegmentOutput | Exception | None] = [None] * len(work)
        pending = []
        for i, item in enumerate(work):
            refusal = self._refusal(item)
            if refusal is None:
                pending.append(i)
            else:
                results[i] = refusal
        if not pending:
            return results
        batch = [work[i] for i in pending]
        try:
            choice = self._choice([item.rows for item in batch], planned)
            stats.graphs.append(choice.kind.value)
            outputs = self._run_rows(batch, choice)
        except Exception as exc:
            if len(pending) == 1:
                cause = exc.cause if isinstance(exc, StepFailed) else exc
                if not isinstance(cause, OutOfPages):
                    logger.exception("forward of %s failed", batch[0].req.rid)
                results[pending[0]] = cause
                return results
            logger.warning("batched forward of %d requests failed (%s); running each alone", len(pending), exc)
            # A StepFailed names the requests whose rows it rolled back; any other error came before
            # attention, so no cache changed.
            touched = isinstance(exc, StepFailed) and exc.layer is not None
            kept = set(exc.rolled_back) if touched else set(range(len(pending)))
            for j, i in enumerate(pending):
                results[i] = self._rerun_alone(work[i], touched, j in kept)
            return results
        for i, out in zip(pending, outputs):
            results[i] = out
        return results

    def _refusal(self, item: _Work) -> Exception | None:
        """Why the model refuses this input before running it (bad tokens, a released or inconsistent
        cache), or None. Checked per request so that one bad input never costs the others a forward."""
        try:
            self.model.check_input(item.input)
        except Exception as exc:
            return exc
        return None

    def _choice(self, rows: list[StepRows], planned: tuple[GraphChoice, ...]) -> GraphChoice:
        """The planned graph of this forward, or the same decision for the rows it really holds (drafts cut
        short near max_new_tokens, plain rows of a request without drafter context, a request that left)."""
        forward, total = forward_kind(rows), sum(r.num_rows for r in rows)
        for choice in planned:
            if (choice.forward, choice.num_requests, choice.actual_rows) == (forward, len(rows), total):
                logger.debug("%s forward: %d requests, %d rows as %s %s", forward.value, len(rows), total,
                             choice.kind.value, choice.padded_shape)
                return choice
        choice = self.runner.choose(rows)
        logger.debug("%s forward: %d requests, %d rows as %s %s (re-chosen: the plan had %s)", forward.value,
                     len(rows), total, choice.kind.value, choice.padded_shape, planned)
        return choice

    def _run_rows(self, work: list[_Work], choice: GraphChoice) -> list[SegmentOutput]:
        out = self.runner.run([item.rows for item in work], choice, capture_layers=self._features)
        return [SegmentOutput(logits, {layer: out.features[layer][j] for layer in item.capture})
                for j, (item, logits) in enumerate(zip(work, out.logits))]

    def _rerun_alone(self, item: _Work, touched: bool, rolled_back: bool) -> SegmentOutput | Exception:
        """After a failed batched forward: `touched` if it may have written some layers' rows, `rolled_back`
        if the runner undid this request's rows. A decode or verify row it could not undo fails; a window
        it touched is recomputed from its prefix state, every window row it ran so far included. Then the
        request runs alone."""
        req = item.req
        try:
            if touched and item.window:
                req.cache.release()
                req.cache = None
                req.cache = install_prefix(self.model, self.cache_set, req.prefix, req.split)
                first = req.split.boundary
                item.tokens = req.prompt[first : first + req.window_done + item.tokens.numel()]
                item.start, req.window_done, req.draft_state = req.cache.pos, 0, None
            elif not rolled_back:
                raise RuntimeError("its rows of the failed batched forward could not be rolled back")
            refusal = self._refusal(item)
            if refusal is not None:
                return refusal
            rows = [item.rows]
            return self._run_rows([item], self.runner.choose(rows))[0]
        except StepFailed as exc:
            return exc.cause if isinstance(exc.cause, Exception) else exc
        except Exception as exc:
            return exc

    def _window_done(self, item: _Work, out: SegmentOutput) -> Emission | None:
        req = item.req
        req.window_done += item.tokens.numel()
        if self.drafter is not None:
            if req.draft_state is None:
                req.draft_state = self.drafter.new_state()
            self.drafter.observe(req.draft_state, out.captured, item.start)
        if not item.final:
            return None
        token = sample(out.logits, req.sampling, req.generator)
        if self.drafter is not None:
            req.spec = SpecRequest(req.cache, req.draft_state, token)
        return self._take_tokens(req, [token])

    def _decoded(self, item: _Work, out: SegmentOutput, stats: _StepTally) -> Emission:
        req = item.req
        if item.draft is None:
            token = sample(out.logits, req.sampling, req.generator)
            if self.drafter is not None:  # keep the drafter's context in step with the cache
                if req.spec is None:  # joined running without a drafter context: start one here
                    req.draft_state = self.drafter.new_state()
                    req.spec = SpecRequest(req.cache, req.draft_state, token)
                self.drafter.observe(req.spec.draft_state, out.captured, item.start)
                req.spec.anchor = token
            stats.plain_tokens += 1
            return self._take_tokens(req, [token])
        k = len(item.draft.tokens)
        emitted = accept(item.draft.tokens, item.draft_probs, out.logits, req.sampling.token_sampling, req.generator)
        commit(self.drafter, req.spec, item.start, k, emitted, out.captured)
        stats.spec.record(k, len(emitted) - 1)
        return self._take_tokens(req, emitted)

    def _take_token(self, req: ActiveRequest, token: int) -> Emission:
        return self._take_tokens(req, [token])

    def _take_tokens(self, req: ActiveRequest, tokens: list[int]) -> Emission:
        """Append sampled tokens in order up to the first stop token or the length limit; one event."""
        params, taken = req.sampling, []
        for token in tokens:
            req.generated.append(token)
            req.next_input = token
            taken.append(token)
            if (token == self.eos and not params.ignore_eos) or token in params.stop_token_ids:
                return self._finish(req, FinishReason.stop(token), last=tuple(taken))
            if len(req.generated) >= params.max_new_tokens:
                break
        if len(req.generated) >= params.max_new_tokens or \
                req.cache.pos + 1 >= self.model.cfg.max_position_embeddings:
            return self._finish(req, FinishReason.of_length(len(req.generated)), last=tuple(taken))
        return req.emit, TokenEvent(req.rid, tuple(taken))

    def _finish(self, req: ActiveRequest, reason: FinishReason | None, last: tuple[int, ...] = (),
                error: str | None = None) -> tuple[EmitFn, TokenEvent]:
        """Remove the request everywhere and free its cache; returns its final event (not yet emitted)."""
        self._requests.pop(req.rid, None)
        try:
            if reason is not None and req.rid in {r.request_id for r in self.scheduler.running}:
                self.scheduler.finish(req.rid)  # a normal end (stop token, length)
            else:
                self.scheduler.abort(req.rid)
        except LookupError:
            pass
        if req.cache is not None:
            req.cache.release()
            req.cache = None
        req.spec = req.draft_state = None
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
