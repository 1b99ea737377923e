"""The asym-prefill role's zero-compute completion: a prompt with N <= W runs no forward on P.

Such a request is cut to no tokens at intake (cut.py), so SGLang initialises its KV sender
for zero pages once D has bootstrapped. Three hooks (hooks.py) then keep it out of every forward:
  PrefillBootstrapQueue.can_prefill_before_bootstrap  AROUND  never prefilled optimistically
  PrefillBootstrapQueue.pop_bootstrapped              AROUND  once bootstrapped it is not queued for a
                                                              forward: P records a placeholder first
                                                              token (D drops it), fills the metadata
                                                              buffer and makes the one, empty, last send
                                                              that concludes the room, then parks it in
                                                              SGLang's in-flight queue (so SGLang's
                                                              abort path still reaches its sender)
  process_disagg_prefill_inflight_queue               AROUND  such requests are polled here, not by
                                                              SGLang's loop, which would release KV
                                                              rows they never held
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any, Callable

from ..shared.request_record import note, request_record
from .cut import prompt_len_of

log = logging.getLogger(__name__)

PLACEHOLDER_TOKEN = 0


def mark_zero_compute(req: Any) -> None:
    note(req, zero_compute=True)


def is_zero_compute(req: Any) -> bool:
    return request_record(req).zero_compute


def around_can_prefill_before_bootstrap(original: Callable, queue: Any, req: Any, *args: Any, **kwargs: Any) -> bool:
    if is_zero_compute(req):
        return False
    return original(queue, req, *args, **kwargs)


def conclude_without_forward(scheduler: Any, req: Any) -> None:
    """The empty last send of a bootstrapped zero-compute request; it then waits in the in-flight queue."""
    import numpy as np

    req.output_ids.append(PLACEHOLDER_TOKEN)
    scheduler.disagg_metadata_buffers.set_buf(req)
    req.disagg_kv_sender.send(np.empty(0, dtype=np.int32), state_indices=None)
    scheduler.disagg_prefill_inflight_queue.append(req)
    log.info("request %s (prompt of %s tokens <= W): no forward on the prefill role, empty transfer sent",
             req.rid, prompt_len_of(req))


def around_pop_bootstrapped(original: Callable, queue: Any, *args: Any, **kwargs: Any) -> list:
    popped = original(queue, *args, **kwargs)
    ready = []
    for req in popped:
        if is_zero_compute(req) and not req.pending_bootstrap:
            conclude_without_forward(queue.scheduler, req)
        else:
            ready.append(req)
    return ready


def _conclude(scheduler: Any, req: Any, poll: Any) -> bool:
    """Handles one polled zero-compute request; True when it is done."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.utils import prepare_abort
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH

    if poll == KVPoll.Success:
        if not isinstance(req.finished_reason, FINISH_ABORT):
            req.finished_reason = FINISH_LENGTH(length=0)
        req.disagg_kv_sender.clear()
        return True
    if poll == KVPoll.Failed:
        message = f"sglang-asym: transfer of request {req.rid} (bootstrap_room={req.bootstrap_room}) failed"
        try:
            req.disagg_kv_sender.failure_exception()
        except Exception as exc:  # the sender's own account of the failure
            message += f": {exc}"
        log.warning(message)
        if not isinstance(req.finished_reason, FINISH_ABORT):
            prepare_abort(req, message, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
        return True
    return False


def around_process_inflight(original: Callable, scheduler: Any, *args: Any, **kwargs: Any) -> list:
    queue = scheduler.disagg_prefill_inflight_queue
    zero = [req for req in queue if is_zero_compute(req)]
    if not zero:
        return original(scheduler, *args, **kwargs)
    scheduler.disagg_prefill_inflight_queue = [req for req in queue if not is_zero_compute(req)]
    try:
        done = original(scheduler, *args, **kwargs)
    finally:
        still = []
        finished = []
        for req in zero:
            (finished if _conclude(scheduler, req, req.disagg_kv_sender.poll()) else still).append(req)
        scheduler.disagg_prefill_inflight_queue = [*scheduler.disagg_prefill_inflight_queue, *still]
    if finished:
        from sglang.srt.disaggregation.prefill import maybe_release_metadata_buffer

        scheduler.output_streamer.stream_output(finished, any(r.return_logprob for r in finished), None)
        for req in finished:
            maybe_release_metadata_buffer(req, scheduler.req_to_metadata_buffer_idx_allocator)
    return [*done, *finished]
