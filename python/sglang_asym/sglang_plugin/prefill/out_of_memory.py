"""asym-prefill lives through a forward that runs out of memory: that batch's requests end on both roles at once.

SGLang's scheduler lets any exception out of `run_batch` end the process: a prefill worker that runs out of
memory on one long prompt (CUDA's OutOfMemoryError; on CPU the allocator's "can't allocate memory") dies
with every request it holds, the router marks it dead, and D waits for the transfers of all of them until
its timeouts. Running out of memory is a property of that batch (the activations of its new tokens), not
of the worker: what the batch allocated is freed with it. So, in both of P's loops (normal and overlap):
  Scheduler.run_batch       AROUND  an asym-prefill forward's out-of-memory error marks each request of the
                                    batch aborted with a 503 that says so, and the room's Failed status to D
                                    will carry that status and those words (room_lifecycle.py; D answers its
                                    client with them, relayed_refusal.py); a prompt in chunked prefill goes to
                                    SGLang's chunked abort at the next step (as stop.py); `run_batch` returns a
                                    FailedPrefillBatch in place of the batch's result
  Scheduler.process_batch_result
                            AROUND  at the failed batch's turn (under overlap, after the batch before it, which
                                    may hold an earlier chunk of the same prompt), each marked request is
                                    retired by SGLang's own `_retire_aborted_prefill_result` (its pages,
                                    metadata slot and KV sender, which tells D) and answered
SGLang's continuous input polling (off by default) waits on a result's copy event, which a forward that never
ran has not: there the error still ends the process, and the log says why.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable

import torch

from ..shared.settings import settings_of
from . import refusal as refusal_relay
from . import stop

log = logging.getLogger(__name__)

OUT_OF_MEMORY_STATUS = HTTPStatus.SERVICE_UNAVAILABLE
# On CPU torch's allocator raises a plain RuntimeError in these words. An allocation that fails inside oneDNN
# (a bf16 matmul's primitive) says "could not create a primitive" and leaves oneDNN unable to create any
# primitive afterwards (or crashes the process): that one still ends the worker, so that it is restarted.
CPU_OUT_OF_MEMORY_WORDS = ("can't allocate memory",)


@dataclass(frozen=True)
class FailedPrefillBatch:
    """What `run_batch` returns for a prefill batch whose forward ran out of memory. It is read as a batch
    result only for "is there a sampling step to launch" (`delay_sample_func`, none)."""

    requests: int
    new_tokens: int
    error: str
    delay_sample_func: None = None


def is_out_of_memory(exc: BaseException) -> bool:
    return (isinstance(exc, (torch.OutOfMemoryError, MemoryError))
            or (isinstance(exc, RuntimeError) and any(words in str(exc) for words in CPU_OUT_OF_MEMORY_WORDS)))


def message_for(failed: FailedPrefillBatch) -> str:
    plural = "" if failed.requests == 1 else "s"
    return (f"sglang-asym: the prefill worker ran out of memory computing this prompt's prefix (a batch of "
            f"{failed.requests} request{plural}, {failed.new_tokens} new tokens: {failed.error}); it serves on, "
            f"retry later or with a shorter prompt")


def mark_batch_failed(scheduler: Any, batch: Any, failed: FailedPrefillBatch) -> None:
    """Every request of `batch` is aborted with the out-of-memory message (its room's Failed frame too)."""
    from sglang.srt.disaggregation.utils import prepare_abort

    message = message_for(failed)
    for req in batch.reqs:
        manager = getattr(getattr(req, "disagg_kv_sender", None), "kv_mgr", None)
        if manager is not None and hasattr(manager, "note_aborted"):
            manager.note_aborted(int(req.bootstrap_room), refusal_relay.relay_reason(
                req.bootstrap_room, OUT_OF_MEMORY_STATUS, message))
        if req is scheduler.chunked_req:  # more chunks were to come: SGLang's chunked abort, at the next step
            stop.to_chunked_abort(scheduler, req, message, OUT_OF_MEMORY_STATUS)
        else:
            prepare_abort(req, message, status_code=OUT_OF_MEMORY_STATUS)


def retire_failed_batch(scheduler: Any, batch: Any) -> None:
    """Frees and answers each request of the failed batch that is still held (the chunked abort retired its
    prompt in chunked prefill already)."""
    answered = [req for req in batch.reqs if scheduler._retire_aborted_prefill_result(req)]
    if answered:
        scheduler.output_streamer.stream_output(answered, any(req.return_logprob for req in answered))


def around_run_batch(original: Callable, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_server_args

    try:
        return original(scheduler, batch, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - only an out-of-memory error of P's prefill is answered here
        settings = settings_of(get_server_args())
        if (settings is None or not settings.is_prefill or not is_out_of_memory(exc)
                or not batch.forward_mode.is_extend()):
            raise
        if scheduler.enable_overlap and envs.SGLANG_ENABLE_DISAGG_PREFILL_CONTINUOUS_INPUT_POLLING.get():
            log.error("the prefill forward ran out of memory under continuous input polling, which waits on a "
                      "result this forward never made: the worker cannot fail the batch alone")
            raise
        failed = FailedPrefillBatch(len(batch.reqs), int(batch.extend_num_tokens or 0),
                                    str(exc).strip().splitlines()[0][:300])
        log.error("prefill batch of %d request(s), %d new tokens, ran out of memory (%s): each request ends with "
                  "HTTP %d on both roles; the worker serves on", failed.requests, failed.new_tokens, failed.error,
                  int(OUT_OF_MEMORY_STATUS), exc_info=True)
    # outside the except block: the exception's frames (and the tensors they hold) are gone by now
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    mark_batch_failed(scheduler, batch, failed)
    return failed


def around_process_batch_result(original: Callable, scheduler: Any, batch: Any, result: Any, *args: Any,
                                **kwargs: Any) -> Any:
    if isinstance(result, FailedPrefillBatch):
        return retire_failed_batch(scheduler, batch)
    return original(scheduler, batch, result, *args, **kwargs)
