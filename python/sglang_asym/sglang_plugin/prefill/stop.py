"""asym-prefill stops computing a chunked prompt whose room already failed.

P computes a long prefix in chunks and ships each chunk's rows as it goes. When the room fails while
chunks are still to come (D aborted the request and told P, D died and a write failed, D gave up
waiting), SGLang's P only learns it once the last chunk has been computed: it polls a request's KV sender
in its in-flight queue, after the prefill. Until then it computes chunks nobody will receive, and the
router, which waits for P's answer too, keeps the client waiting (13 s for a 1000-token prompt in
256-token chunks on two shared cores, against 3 s when P is aborted directly).

Hooked before each of P's scheduling steps (SchedulerDisaggregationPrefillMixin.
get_next_disagg_prefill_batch_to_run, whose first act is SGLang's `process_pending_chunked_abort`): if the
request in chunked prefill has a KV sender that polls Failed, it is handed to SGLang's own chunked-abort
path, as `/abort_request` on P would; the next chunk never runs, its pages and metadata slot are freed,
and P answers the request with an error that says why.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any, Callable

log = logging.getLogger(__name__)

ROOM_FAILED_MESSAGE = ("sglang-asym: the prefix transfer of this request failed (the decode worker aborted it, "
                       "gave up waiting or is gone); the prefill worker stopped computing it")


def room_failed(req: Any) -> bool:
    from sglang.srt.disaggregation.base.conn import KVPoll

    sender = getattr(req, "disagg_kv_sender", None)
    return sender is not None and not req.pending_bootstrap and sender.poll() == KVPoll.Failed


def before_next_prefill_batch(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    req = scheduler.chunked_req
    if req is None or scheduler._pending_chunked_abort_req is not None or not room_failed(req):
        return
    log.warning("room %s of request %s failed with %d of its %d prefix tokens computed: stopping its prefill",
                req.bootstrap_room, req.rid, getattr(req, "prefix_len", 0), len(req.origin_input_ids))
    to_chunked_abort(scheduler, req, ROOM_FAILED_MESSAGE, HTTPStatus.INTERNAL_SERVER_ERROR)


def to_chunked_abort(scheduler: Any, req: Any, message: str, status: int) -> None:
    """Hands the request in chunked prefill to SGLang's chunked-abort path, which ends it at the next step
    (its next chunk never runs) with `message` and `status`, as `/abort_request` on P would."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req.discard_output_reason = FINISH_ABORT(message, status_code=status)
    scheduler._pending_chunked_abort_req = req


def around_next_prefill_batch(original: Callable, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    before_next_prefill_batch(scheduler)
    return original(scheduler, *args, **kwargs)
