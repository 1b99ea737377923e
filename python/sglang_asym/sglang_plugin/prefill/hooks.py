"""The prefill room's table: the SGLang symbols an asym-prefill scheduler hooks, and its intake hooks.

  model_loader.loader._initialize_model
                            AROUND  builds SGLang's V4.1 model truncated to the prefill role, binds its
                                    filtered weight loading (model.py) and P's cut in SGLang's layer loop
                                    (cut_hook.py); draft models and every other server's model are built
                                    unchanged
  disaggregation.utils.get_kv_class
                            AROUND  on Mooncake: the exact-payload KV manager (exact_payload.py: the
                                    manifest's rows and nothing else); in SGLang's own prefill mode
                                    (STOCK_PREFILL_HOOKS, its only hook there) SGLang's manager and sender
                                    keeping a rebootstrapped room's handshake (shared/room_lifecycle.py)
  PrefillBootstrapQueue.add AROUND  cuts each fresh request to its first B = N - W tokens (cut.py) before
                                    SGLang checks capacity, creates the KV sender and queues it, and tells
                                    the KV manager the room's split; N <= W is cut to nothing and marked
                                    zero-compute; prompt logprobs are refused with a 400 (the
                                    admission check's text; output logprobs pass: D computes every
                                    output token); every refusal here, and SGLang's own intake
                                    refusals, reach D (refusal.py)
  PrefillBootstrapQueue.can_prefill_before_bootstrap, .pop_bootstrapped,
  SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue
                            AROUND  a zero-compute request concludes its room with one empty send and no
                                    forward (zero.py)
  SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run
                            AROUND  a prompt in chunked prefill whose room failed goes to SGLang's
                                    chunked-abort path before its next chunk (stop.py)
  Scheduler.run_batch, Scheduler.process_batch_result
                            AROUND  a prefill forward that runs out of memory ends its batch's requests on
                                    both roles with a 503 and P serves on (out_of_memory.py)
Every hook is a no-op on a server that is not asym-prefill (the decode role shares the scheduler table),
but get_kv_class's on SGLang's own prefill mode.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from ...config import V41Config
from ...split import SplitPlan
from ..shared.admission_check import PROMPT_LOGPROBS_MESSAGE, asks_prompt_logprobs
from ..shared.settings import settings_of
from . import exact_payload, out_of_memory, stop, zero
from . import refusal as refusal_relay
from .cut import cut_request, prefill_cut_for, prompt_len_of
from .cut_hook import install_prefill_cut
from .model import install_prefill_loading, truncated_construction
from .role import PrefillRole

PREFILL = "sglang.srt.disaggregation.prefill"
INITIALIZE_MODEL = "sglang.srt.model_loader.loader._initialize_model"
GET_KV_CLASS = "sglang.srt.disaggregation.utils.get_kv_class"
QUEUE_ADD = f"{PREFILL}.PrefillBootstrapQueue.add"
EARLY = f"{PREFILL}.PrefillBootstrapQueue.can_prefill_before_bootstrap"
POP_BOOTSTRAPPED = f"{PREFILL}.PrefillBootstrapQueue.pop_bootstrapped"
INFLIGHT = f"{PREFILL}.SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue"
NEXT_BATCH = f"{PREFILL}.SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
RUN_BATCH = f"{SCHEDULER}.run_batch"
PROCESS_BATCH_RESULT = f"{SCHEDULER}.process_batch_result"

log = logging.getLogger(__name__)


def serving_prefill_role(model_config: Any, load_config: Any) -> PrefillRole | None:
    """The prefill role this process builds its target model for, or None (not an asym-prefill
    server, or a draft model). Reads the ServerArgs SGLang published in this process."""
    from sglang.srt.runtime_context import get_server_args

    settings = settings_of(get_server_args())
    if settings is None or not settings.is_prefill:
        return None
    if getattr(load_config, "draft_model_idx", None) is not None or getattr(model_config, "is_draft_model", False):
        return None
    return PrefillRole.from_config(V41Config.from_json_file(model_config.model_path))


def around_initialize_model(original: Callable, model_config: Any, load_config: Any, *args: Any, **kwargs: Any) -> Any:
    role = serving_prefill_role(model_config, load_config)
    if role is None:
        return original(model_config, load_config, *args, **kwargs)
    with truncated_construction(role):
        model = original(model_config, load_config, *args, **kwargs)
    return install_prefill_cut(install_prefill_loading(model, role), role)


@functools.lru_cache(maxsize=4)
def _model_config(model_path: str) -> V41Config:
    return V41Config.from_json_file(model_path)


def around_prefill_queue_add(original: Callable, queue: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    from http import HTTPStatus

    from sglang.srt.disaggregation.utils import is_unadmitted_reject, prepare_abort
    from sglang.srt.runtime_context import get_server_args

    settings = settings_of(get_server_args())
    if settings is not None and settings.is_prefill and is_unadmitted_reject(req):
        # SGLang's intake refused it (it retires the one-token stub): D admitted it too and must hear so
        reason = req.finished_reason or req.to_finish
        refusal_relay.relay_refusal(queue.kv_manager, req.bootstrap_room, getattr(reason, "message", str(reason)),
                                    getattr(reason, "status_code", None))
        return original(queue, req, *args, **kwargs)
    # a re-queued request keeps its cut
    if settings is None or not settings.is_prefill or prompt_len_of(req) is not None:
        return original(queue, req, *args, **kwargs)
    refusal = None
    try:
        cfg = _model_config(queue.scheduler.model_config.model_path)  # the model this scheduler serves
        n = len(req.origin_input_ids)
        cut = prefill_cut_for(cfg, settings, n)
        if asks_prompt_logprobs(req.return_logprob, req.logprob_start_len, n):
            # both roles' admission check refuses these first; this covers a request that reached P's scheduler
            # another way (SGLang sets an output-only start to N before this queue)
            refusal = (HTTPStatus.BAD_REQUEST, PROMPT_LOGPROBS_MESSAGE)
        else:
            cut_request(req, cut)
            if not cut.runs_forward:
                zero.mark_zero_compute(req)
    except ValueError as exc:  # SplitError / PrefillCutError: a prompt this split cannot take
        refusal = (HTTPStatus.BAD_REQUEST, f"sglang-asym: {exc}")
    if refusal is None:
        result = original(queue, req, *args, **kwargs)
        exact_payload.expect_room(queue.kv_manager, req.bootstrap_room,
                                  SplitPlan(cfg, n, settings.window, settings.semantics))
        return result
    # as SGLang's own capacity refusal in this queue: nothing is held yet, the client gets the error
    status, message = refusal
    log.error("request %s refused: %s", req.rid, message)
    refusal_relay.relay_refusal(queue.kv_manager, req.bootstrap_room, message, status)
    prepare_abort(req, message, status_code=status)
    queue.scheduler.output_streamer.stream_output([req], req.return_logprob)
    return None


HOOKS: tuple[tuple[str, Callable, str], ...] = (
    (INITIALIZE_MODEL, around_initialize_model, "AROUND"),
    (GET_KV_CLASS, exact_payload.around_get_kv_class, "AROUND"),
    (QUEUE_ADD, around_prefill_queue_add, "AROUND"),
    (EARLY, zero.around_can_prefill_before_bootstrap, "AROUND"),
    (POP_BOOTSTRAPPED, zero.around_pop_bootstrapped, "AROUND"),
    (INFLIGHT, zero.around_process_inflight, "AROUND"),
    (NEXT_BATCH, stop.around_next_prefill_batch, "AROUND"),
    (RUN_BATCH, out_of_memory.around_run_batch, "AROUND"),
    (PROCESS_BATCH_RESULT, out_of_memory.around_process_batch_result, "AROUND"),
)

STOCK_PREFILL_HOOKS: tuple[tuple[str, Callable, str], ...] = (
    (GET_KV_CLASS, exact_payload.around_get_kv_class, "AROUND"),
)
