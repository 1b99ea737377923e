"""The asym-decode role inside SGLang's decode scheduler: destinations for B, the window step over [B, N).

Five hooks on SGLang 0.5.23's PD decode path (hooks.py registers them; each target is canary-pinned):
  DecodePreallocQueue._swa_tail_len            AROUND  SWA slots from the window below B on, where P's
                                                       encoder window rows land (SGLang allocates them
                                                       only for the window ending at N)
  DecodePreallocQueue._send_kv_metadata        AROUND  the destinations D sends P are those of the
                                                       prefix B = N - W (destinations.py)
  DecodeTransferQueue._commit_transfer_to_req  AROUND  P's placeholder token (P samples nothing that
                                                       counts) is dropped, with the logprob entries
                                                       the commit appended for it; the request is marked
                                                       "window pending" with its rows [B, N) to run
  Scheduler.get_next_disagg_decode_batch_to_run AROUND after SGLang picked its decode batch, one
                                                       window step: the project's budget policy
                                                       (sched.plan_step) picks which pending windows
                                                       run and how many rows each, beside that decode
                                                       batch; a request whose window is complete gets
                                                       its first token, as a commit from P would have
                                                       given it, and with return_logprob that token's
                                                       logprobs (first_token_logprobs.py)
  Scheduler._get_new_prebuilt_batch             AROUND  requests whose window is pending are not
                                                       merged into the running batch yet

A window-pending request stays in SGLang's `waiting_queue`, so SGLang's own abort path finds it and
frees its rows; only the prebuilt merge skips it. Once its window completes it is an ordinary
committed PD request: SGLang's prebuilt path streams the first token, checks the stop conditions and
merges it into the running batch.
On the CPU route a step is mixed (the policy's "mixed" step mode): the window chunks ride in the running
batch's decode forward, one forward holding both (reference_forward.ride_next_decode), so the running
requests decode in every iteration and each forward's rows stay within the token budget. SGLang's own
forward (CUDA) takes no riders: there, as on CPU with no decode batch to ride, the chunks run as an EXTEND
forward of their own (window_batch.py), and nothing on that path imports the CPU route.
A window completed by its own forward is merged at once, so the request decodes in the same iteration.
Under speculative decoding (--speculative-algorithm DSPARK, cpu_platform/dspark_worker.py) the running
batch's forward is a TARGET_VERIFY forward, which takes no riders: the chunks always run as their own
EXTEND, through the speculative worker, which also hands the window's features to the drafter (its context is the window).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from ...sched import RunningRequest, SchedulerConfig, WaitingRequest, plan_step
from ..cpu_platform.deterministic import deterministic_inference
from ..shared.request_record import note, request_record
from ..shared.settings import AsymSettings, settings_of
from . import first_token_logprobs
from .transfer_fallback import fallback_of
from .window_batch import WindowChunk, WindowSamples, run_window_chunks, sample_window, window_forward_batch

log = logging.getLogger(__name__)
_RAISED_ATTR = "_sglang_asym_budget_raised"  # the scheduler logged the deterministic budget raise once

STEP_ATTR = "_sglang_asym_window_steps"


@dataclass(frozen=True)
class WindowProgress:
    """A request whose rows [next_row, end) still run on D. `end` is the prompt length N, or for a request
    SGLang rebootstrapped after a retraction, the length of the sequence it asked P for again (see
    around_commit_transfer_to_req); `replayed_token`: its first token is already in output_ids."""

    boundary: int  # B: the first row D computes
    next_row: int
    end: int
    arrival_step: int
    last_chunk_step: int | None = None
    replayed_token: bool = False

    @property
    def rows_left(self) -> int:
        return self.end - self.next_row


def _settings() -> AsymSettings | None:
    from sglang.srt.runtime_context import get_server_args

    settings = settings_of(get_server_args())
    return settings if settings is not None and not settings.is_prefill else None


def boundary_of(prompt_len: int, settings: AsymSettings) -> int:
    return max(prompt_len - settings.window, 0)


def window_of(req: Any) -> WindowProgress | None:
    return request_record(req).window


def around_send_kv_metadata(original: Callable, queue: Any, decode_req: Any, kv_indices: Any, page_size: int,
                            state_indices: Any = None, **kwargs: Any) -> Any:
    settings = _settings()
    if settings is not None:
        from .destinations import destinations_for_prefix

        req = decode_req.req
        # P computes [0, B) of what it is given: the prompt, or for a rebootstrap (SGLang's retraction on a
        # V4 pool) the prompt and the output tokens but the last one, which SGLang keeps aside to replay
        boundary = boundary_of(len(req.origin_input_ids) + len(req.output_ids), settings)
        kv_indices, state_indices = destinations_for_prefix(queue, req, boundary, state_indices)
    return original(queue, decode_req, kv_indices, page_size, state_indices, **kwargs)


def around_swa_tail_len(original: Callable, queue: Any, seq_len: int, *args: Any, **kwargs: Any) -> int:
    """SGLang gives a decode request SWA slots only for the window ending at its prompt's end, from
    floor_page(N - W). An asymmetric request needs them from floor_page(B - W) = floor_page(N - 2W): P ships
    the encoder layers' window rows below B, and D's window step reads them."""
    tail = original(queue, seq_len, *args, **kwargs)
    settings = _settings()
    if settings is None or seq_len <= 0 or tail >= seq_len:
        return tail
    page = queue.token_to_kv_pool_allocator.page_size
    start = max(0, seq_len - 2 * settings.window) // page * page
    return max(tail, seq_len - start)


def around_commit_transfer_to_req(original: Callable, queue: Any, decode_req: Any, *args: Any, **kwargs: Any) -> Any:
    """After SGLang's commit, the request's window [B, end) is pending. A fresh request: P's placeholder
    token is dropped (D's window computes the first token), end = N. A request SGLang retracted and
    rebootstrapped (a V4 pool keeps no host copy: P recomputed the prompt and the output tokens but the
    last, and the commit replays that last token): the window covers the sequence P was given, its floors
    are that sequence's, and the token it samples is not kept (the replayed one is the next input)."""
    req = decode_req.req
    replays = bool(getattr(decode_req, "is_rebootstrap", False)) and \
        getattr(req, "pd_rebootstrap_forced_output_id", None) is not None
    result = original(queue, decode_req, *args, **kwargs)
    settings = _settings()
    if settings is None or req.finished() or getattr(req, "to_finish", None) is not None:
        return result
    if not replays:
        if not getattr(decode_req, "is_rebootstrap", False) and len(req.output_ids) != 1:
            raise RuntimeError(f"request {req.rid}: expected P's one placeholder token at commit, found "
                               f"{len(req.output_ids)} output tokens")
        req.output_ids.pop()  # P samples nothing that counts: D's window computes the first token
        if req.return_logprob:
            for name in ("output_token_logprobs_val", "output_token_logprobs_idx", "output_top_logprobs_val",
                         "output_top_logprobs_idx", "output_token_ids_logprobs_val", "output_token_ids_logprobs_idx"):
                values = getattr(req.logprob, name, None)
                if values:  # the commit appended P's entry for the placeholder
                    values.pop()
    end = len(req.origin_input_ids) + len(req.output_ids) - (1 if replays else 0)
    if end != len(req.origin_input_ids):
        note(req, prompt_len=end)  # the CPU route's floors: those of what P was given
    boundary = boundary_of(end, settings)
    step = getattr(queue.scheduler, STEP_ATTR, 0)
    first_row = 0 if fallback_of(req) is not None else boundary  # a recompute fallback: D computes [0, B) too
    note(req, window=WindowProgress(boundary, first_row, end, step, replayed_token=replays))
    return result


def step_budget(settings: AsymSettings, max_running: int, deterministic: bool) -> int:
    """Rows per step: the configured budget, at least every running request's decode row and one window;
    with deterministic inference also room for a whole window chunk beside max_running - 1 decode rows
    (its chunks are whole or wait, so a smaller budget would leave the queue head waiting for ever)."""
    budget = max(settings.token_budget, max_running, settings.window)
    chunk = settings.chunk_rows
    if deterministic and chunk is not None and budget < max_running - 1 + chunk:
        budget = max_running - 1 + chunk
    return budget


def scheduler_config(scheduler: Any, settings: AsymSettings) -> SchedulerConfig:
    """The budget policy for this server (decode rows are 1 per running request: no speculation here)."""
    max_running = int(scheduler.max_running_requests)
    deterministic = deterministic_inference()
    budget = step_budget(settings, max_running, deterministic)
    raised = budget > max(settings.token_budget, max_running, settings.window)
    if raised and not getattr(scheduler, _RAISED_ATTR, False):
        setattr(scheduler, _RAISED_ATTR, True)
        log.warning("sglang-asym: --asym-token-budget %d leaves no room for a whole %d-row window chunk beside %d "
                    "running requests under --enable-deterministic-inference; using %d rows per step",
                    settings.token_budget, settings.chunk_rows, max_running, budget)
    return SchedulerConfig(token_budget=budget, max_window_rows_per_step=max(budget, settings.window),
                           max_running=max_running, num_draft_tokens=0, window=settings.window,
                           window_chunk=settings.chunk_rows,
                           deterministic=deterministic)  # whole chunks on the grid from B


def recompute_prefix(scheduler: Any, req: Any) -> None:
    """A recompute fallback's prefix [0, B): one EXTEND of its own, the prefill role's work done by the full
    model (transfer_fallback.py). It runs outside the step budget, as P's forward would have: one piece
    without floors, whose rows land where P's payload would have landed."""
    progress = window_of(req)
    started = time.perf_counter()
    run_window_chunks(scheduler, [WindowChunk(req, progress.next_row, progress.boundary)])
    note(req, window=replace(progress, next_row=progress.boundary))
    fallback = fallback_of(req)
    log.warning("request %s: recomputed its %d-token prefix on this decode worker in %.3f s (%.3f s after its "
                "transfer failed)", req.rid, progress.boundary, time.perf_counter() - started,
                time.perf_counter() - fallback.since if fallback is not None else 0.0)


def recompute_fallback_prefixes(scheduler: Any) -> None:
    """Every pending window whose prefix never came from P (a recompute fallback) gets it computed first."""
    for req in list(scheduler.waiting_queue):
        progress = window_of(req)
        if progress is not None and progress.next_row < progress.boundary:
            recompute_prefix(scheduler, req)


@dataclass(frozen=True)
class WindowStep:
    """The window chunks planned at scheduler step `step`: finish_step records that step as each unfinished
    request's last chunk step (the policy's fairness input), whenever the chunks' logits arrive."""

    step: int
    chunks: tuple[WindowChunk, ...]


def plan_window_step(scheduler: Any, decoding: list[Any], settings: AsymSettings) -> WindowStep | None:
    """The window chunks of this scheduler iteration beside the requests `decoding` in it, chosen by the
    project's budget policy (sched.plan_step); None when no window runs now."""
    step = getattr(scheduler, STEP_ATTR, 0)
    setattr(scheduler, STEP_ATTR, step + 1)
    pending = sorted((req for req in scheduler.waiting_queue if window_of(req) is not None),
                     key=lambda req: window_of(req).arrival_step)  # stable: commit order within a step
    if not pending:
        return None
    running = [RunningRequest(req.rid, 1) for req in decoding]
    config = scheduler_config(scheduler, settings)
    if len(running) >= config.max_running:
        return None  # no free running slot for a request whose window completes
    waiting = [WaitingRequest(req.rid, window_of(req).rows_left, window_of(req).arrival_step,
                              last_chunk_step=window_of(req).last_chunk_step) for req in pending]
    plan = plan_step(running, waiting, step, config)
    by_rid = {req.rid: req for req in pending}
    chunks = []
    for admitted in plan.admitted:
        req = by_rid[admitted.request_id]
        progress = window_of(req)
        chunks.append(WindowChunk(req, progress.next_row, progress.next_row + admitted.window_rows))
    if not chunks:
        return None
    log.debug("window step %d: %d rows over %d requests beside %d decoding", step,
              sum(c.end - c.start for c in chunks), len(chunks), len(running))
    return WindowStep(step, tuple(chunks))


def finish_step(window_step: WindowStep, samples: WindowSamples) -> int:
    """Advances each request past its chunk; a request whose window is complete gets its first token, where
    SGLang's commit puts P's, and its logprobs when it asks for them. Returns how many windows completed."""
    completed = 0
    for row, (chunk, token) in enumerate(zip(window_step.chunks, samples.tokens, strict=True)):
        req = chunk.req
        progress = window_of(req)
        if progress is None or req.finished():  # aborted meanwhile: SGLang's abort path frees it
            continue
        if chunk.end == progress.end:
            note(req, window=None)
            completed += 1
            if not progress.replayed_token:  # a replayed token kept its entries from before the retraction
                req.output_ids.append(token)
                first_token_logprobs.record(req, samples.output, row, token)
        else:
            note(req, window=replace(progress, next_row=chunk.end, last_chunk_step=window_step.step))
    return completed


def windows_ride() -> bool:
    """Whether window chunks ride in a decode forward: only the CPU route's forward (the reference model over
    SGLang's pool, cpu_platform/reference_forward.py) runs queued extend rows inside a decode forward."""
    from ..cpu_platform.engine_mode import cpu_engine_selected

    return cpu_engine_selected()


def _run_unridden(scheduler: Any) -> None:
    """Window chunks queued for a decode forward that never ran (it failed or was skipped) run now, alone."""
    from ..cpu_platform.reference_forward import take_unridden

    for rider in take_unridden():
        window_step = rider.work
        live = WindowStep(window_step.step, tuple(c for c in window_step.chunks if not c.req.finished()))
        log.warning("%d window chunks queued for a decode forward that did not run; running them alone",
                    len(live.chunks))
        if live.chunks:
            finish_step(live, run_window_chunks(scheduler, live.chunks))


def around_get_next_decode_batch(original: Callable, scheduler: Any, running_batch: Any, *args: Any,
                                 **kwargs: Any) -> Any:
    """After SGLang picked this iteration's decode batch, the window step: on the CPU route its chunks ride in
    that decode forward (one mixed forward); with no decode forward to ride (or a speculative one, or SGLang's
    own forward on CUDA) they run as a forward of their own, and if that completed a window, SGLang schedules again so the request decodes in this same
    iteration."""
    settings = _settings()
    plan = original(scheduler, running_batch, *args, **kwargs)
    if settings is None:
        return plan
    rides = windows_ride()
    if rides:
        _run_unridden(scheduler)
    recompute_fallback_prefixes(scheduler)
    batch = plan.batch_to_run
    decode = batch if batch is not None and batch.forward_mode.is_decode() else None
    window_step = plan_window_step(scheduler, list(decode.reqs) if decode is not None else [], settings)
    if window_step is None:
        return plan
    if rides and decode is not None and scheduler.spec_algorithm.is_none():
        from ..cpu_platform.reference_forward import ride_next_decode

        forward_batch = window_forward_batch(scheduler, window_step.chunks)
        ride_next_decode(forward_batch,
                         lambda logits: finish_step(window_step, sample_window(scheduler, forward_batch, logits)),
                         work=window_step)
        return plan
    if finish_step(window_step, run_window_chunks(scheduler, window_step.chunks)) and batch is None:
        return original(scheduler, plan.running_batch, *args, **kwargs)
    return plan


def around_get_new_prebuilt_batch(original: Callable, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    pending = [req for req in scheduler.waiting_queue if window_of(req) is not None]
    if not pending:
        return original(scheduler, *args, **kwargs)
    scheduler.waiting_queue = [req for req in scheduler.waiting_queue if window_of(req) is None]
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        scheduler.waiting_queue = pending + scheduler.waiting_queue
