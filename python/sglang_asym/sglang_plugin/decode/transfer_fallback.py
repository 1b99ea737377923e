"""`--asym-transfer-fallback recompute` on an asym-decode server: a request whose prefix handshake or
transfer failed is computed by this decode worker, which holds the full model, instead of ending in an error.

Three hooks on SGLang 0.5.23's PD decode path (hooks.py registers them; canary-pinned):
  DecodePreallocQueue.pop_preallocated   AROUND  handshake failures (P unreachable, P refused the room)
  DecodeTransferQueue.pop_transferred    AROUND  transfer failures (P died or failed mid-send, D's waiting
                                                 timeout)
  Scheduler.abort_request                AROUND  marks the queued requests a client aborts: SGLang aborts
                                                 them through their receivers, whose failure reads like
                                                 an unreachable P's
While either runs, the scheduler's output streamer holds back the abort SGLang streams for such a request
(`_held_back`); SGLang's own failure path still runs in full: it tells P, counts the failure and frees or
holds the request's pages (deferred release, SGLang's default, keeps them until P confirms no write is
in flight). Afterwards each held-back request is re-admitted to the prealloc queue as a fake transfer
(SGLang's own local-transfer path, FAKE_BOOTSTRAP_HOST): fresh pages, no peer. Pages still held for a
deferred release stay with a shallow copy of the request, so that release frees the old pages and not
the new ones. At commit (window_step.py) the request's window starts at row 0 instead of B: its first
window step runs the prefix [0, B) as one EXTEND of its own (the prefill role's computation, done by the
full model), then [B, N) runs as any window does. Requests that never fall back: one aborted by its
client (on D, or on P alone: P tells D in PREFILL_ABORT_WORDS), one that fell back before, and a
rebootstrapped one (its outputs exist).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..shared.request_record import note, request_record
from ..shared.room_lifecycle import PREFILL_ABORT_WORDS
from ..shared.settings import settings_of

log = logging.getLogger(__name__)

# What SGLang's decode queues say when a request's handshake or transfer fails (decode.py in 0.5.23; the
# canary test pins each prefix to SGLang's source).
FAILURE_PREFIXES = ("Decode handshake failed", "Decode transfer failed")
# A request its client aborted is never recomputed: on D, Scheduler.abort_request marks it (its record's
# client_aborted) before SGLang aborts its receiver, whose failure then reads like any other; on P alone,
# shared/room_lifecycle.py tells D in PREFILL_ABORT_WORDS.


@dataclass(frozen=True)
class Fallback:
    """Why a request is recomputed here, and when that was decided."""

    reason: str
    since: float


def fallback_of(req: Any) -> Fallback | None:
    return request_record(req).fallback


def _recomputes() -> bool:
    from sglang.srt.runtime_context import get_server_args

    settings = settings_of(get_server_args())
    return settings is not None and settings.recomputes_failed_transfers


def failure_message(req: Any) -> str | None:
    """The handshake or transfer failure that aborted `req`, if it is one this worker may recompute."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    reason = req.finished_reason
    if not isinstance(reason, FINISH_ABORT) or req.to_finish is not None:
        return None  # not aborted, or its client asked for the abort
    message = str(getattr(reason, "message", "") or "")
    if not message.startswith(FAILURE_PREFIXES) or PREFILL_ABORT_WORDS in message:
        return None
    if request_record(req).client_aborted or fallback_of(req) is not None:
        return None
    if req.output_ids or getattr(req, "pd_rebootstrap_in_progress", False):
        return None  # a retracted request's outputs exist: P's rebootstrap, or nothing
    return message


class _HoldingStreamer:
    """The scheduler's output streamer, except that it streams no abort of a request this worker will
    recompute (SGLang's streamer has slots: it is wrapped, not patched)."""

    def __init__(self, streamer: Any) -> None:
        self._streamer = streamer
        self.held: dict[int, tuple[Any, str]] = {}

    def stream_output(self, reqs: list, *args: Any, **kwargs: Any) -> Any:
        passing = []
        for req in reqs:
            message = failure_message(req)
            if message is None:
                passing.append(req)
            else:
                self.held[id(req)] = (req, message)
        return self._streamer.stream_output(passing, *args, **kwargs) if passing else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._streamer, name)


@contextlib.contextmanager
def _held_back(scheduler: Any) -> Iterator[dict[int, tuple[Any, str]]]:
    """While it is open, the scheduler streams no abort of a request this worker will recompute."""
    streamer = scheduler.output_streamer
    holding = _HoldingStreamer(streamer)
    scheduler.output_streamer = holding
    try:
        yield holding.held
    finally:
        scheduler.output_streamer = streamer


@functools.lru_cache(maxsize=1)
def _fallback_counter() -> Any:
    from prometheus_client import Counter

    return Counter("sglang_asym:transfer_fallback_recompute", "Requests whose prefix handshake or transfer failed "
                   "and that this decode worker recomputed itself (--asym-transfer-fallback recompute).",
                   ("model_name",))


def _readmit(prealloc_queue: Any, req: Any, message: str, deferred: list) -> None:
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
    from sglang.srt.runtime_context import get_server_args

    for entry in deferred:  # (decode_req, ...): its pages wait for P's word; the copy keeps them
        if entry[0].req is req:
            entry[0].req = copy.copy(req)
    req.detach_kv()
    req.lock = None
    req.finished_reason = None
    note(req, fallback=Fallback(message, time.perf_counter()))
    room, req.bootstrap_host = req.bootstrap_room, FAKE_BOOTSTRAP_HOST
    log.warning("request %s (bootstrap_room %s): %s; recomputing its %d-token prompt on this decode worker "
                "(--asym-transfer-fallback recompute)", req.rid, room, message.split(" for request")[0],
                len(req.origin_input_ids))
    _fallback_counter().labels(model_name=get_server_args().served_model_name).inc()
    prealloc_queue.add(req)


def _around_pop(original: Callable, queue: Any, deferred_of: Callable[[Any], list], *args: Any, **kwargs: Any) -> Any:
    if not _recomputes():
        return original(queue, *args, **kwargs)
    with _held_back(queue.scheduler) as held:
        result = original(queue, *args, **kwargs)
    for req, message in held.values():
        _readmit(queue.scheduler.disagg_decode_prealloc_queue, req, message, deferred_of(queue))
    return result


def around_abort_request(original: Callable, scheduler: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    """Marks the requests an abort names in D's prealloc and transfer queues (SGLang's own matching) before
    SGLang aborts them, so that the failure their receivers then report is not recomputed."""
    if _recomputes():
        for queue in (scheduler.disagg_decode_prealloc_queue, scheduler.disagg_decode_transfer_queue):
            for decode_req in queue.queue:
                if recv_req.abort_all or decode_req.req.rid.startswith(recv_req.rid):
                    note(decode_req.req, client_aborted=True)
    return original(scheduler, recv_req, *args, **kwargs)


def around_pop_preallocated(original: Callable, queue: Any, *args: Any, **kwargs: Any) -> Any:
    return _around_pop(original, queue, lambda q: [], *args, **kwargs)


def around_pop_transferred(original: Callable, queue: Any, *args: Any, **kwargs: Any) -> Any:
    return _around_pop(original, queue, lambda q: q._deferred_releases, *args, **kwargs)
