"""The decode room's table: the SGLang symbols an asym-decode scheduler hooks.

  DecodePreallocQueue._swa_tail_len, ._send_kv_metadata, DecodeTransferQueue._commit_transfer_to_req,
  SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run, ._get_new_prebuilt_batch
                            AROUND  SWA slots and destinations for B, P's placeholder dropped, the window
                                    [B, N) as EXTEND chunks riding in the decode forward under the budget
                                    policy (window_step.py)
  DecodePreallocQueue.pop_preallocated, DecodeTransferQueue.pop_transferred, Scheduler.abort_request
                            AROUND  with --asym-transfer-fallback recompute: a failed handshake or transfer
                                    is recomputed on D, unless its client aborted it (transfer_fallback.py)
Every hook is a no-op on a server that is not asym-decode (the prefill role shares the scheduler table).
"""

from __future__ import annotations

from typing import Callable

from . import transfer_fallback, window_step

DECODE = "sglang.srt.disaggregation.decode"
SWA_TAIL = f"{DECODE}.DecodePreallocQueue._swa_tail_len"
SEND_METADATA = f"{DECODE}.DecodePreallocQueue._send_kv_metadata"
COMMIT = f"{DECODE}.DecodeTransferQueue._commit_transfer_to_req"
NEXT_BATCH = f"{DECODE}.SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run"
PREBUILT_BATCH = f"{DECODE}.SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch"
POP_PREALLOCATED = f"{DECODE}.DecodePreallocQueue.pop_preallocated"
POP_TRANSFERRED = f"{DECODE}.DecodeTransferQueue.pop_transferred"
SCHEDULER_ABORT = "sglang.srt.managers.scheduler.Scheduler.abort_request"

HOOKS: tuple[tuple[str, Callable, str], ...] = (
    (SWA_TAIL, window_step.around_swa_tail_len, "AROUND"),
    (SEND_METADATA, window_step.around_send_kv_metadata, "AROUND"),
    (COMMIT, window_step.around_commit_transfer_to_req, "AROUND"),
    (NEXT_BATCH, window_step.around_get_next_decode_batch, "AROUND"),
    (PREBUILT_BATCH, window_step.around_get_new_prebuilt_batch, "AROUND"),
    (POP_PREALLOCATED, transfer_fallback.around_pop_preallocated, "AROUND"),
    (POP_TRANSFERRED, transfer_fallback.around_pop_transferred, "AROUND"),
    (SCHEDULER_ABORT, transfer_fallback.around_abort_request, "AROUND"),
)
