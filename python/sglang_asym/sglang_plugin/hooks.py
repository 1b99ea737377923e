"""The SGLang symbols the plugin hooks, and what each hook does.

  ServerArgs.add_cli_args   AFTER   add the asymmetric modes and --asym-* flags (so --help lists them)
  ServerArgs.from_cli_args  AROUND  refuse a V4.1 checkpoint SGLang's pool cannot hold (servable.py, every
                                    mode); validate + translate asym-* to prefill/decode, attach AsymSettings
  prepare_server_args       AROUND  argument errors as argparse-style exits
  runtime_context.publish   AFTER   on CUDA, an asymmetric server's launcher and schedulers refuse the
                                    settings the path does not handle (cuda_guards.py); in a
                                    scheduler process: on CPU, applies cpu_patches.py (SGLang's
                                    own engine on CPU); for an asymmetric ServerArgs, registers and
                                    applies the scheduler hooks below (in that process only: their
                                    modules do not import on a CPU-only launcher); in the launcher
                                    process of an asymmetric server, the drain refusal (drain.py:
                                    TokenizerManager.generate_request AROUND, 503 after SIGTERM) and
                                    admission control with request deadlines (admission.py:
                                    TokenizerManager.__init__ AFTER, .generate_request AROUND,
                                    CommonKVBootstrapServer._setup_routes AFTER, http_server.
                                    _create_error_response AFTER for Retry-After); and
                                    the refusals both roles make alike before any bootstrap
                                    (admission_check.py: TokenizerManager._init_req_state AROUND)
  ServerArgs.from_cli_args also sets, for an asym server, the environment defaults its processes
                                    inherit: the PD waits bounded by --asym-request-deadline-s
                                    (admission.py) and /health as liveness (liveness.py)
Scheduler hooks (each target and the SGLang code it relies on: test_asym_engine_canaries.py):
  model_loader.loader._initialize_model
                            AROUND  asym-prefill: builds SGLang's V4.1 model truncated to the prefill
                                    role, binds its filtered weight loading (prefill_model.py) and
                                    P's cut in SGLang's layer loop (prefill_cut_hook.py);
                                    draft models and every other server's model are built unchanged
  disaggregation.utils.setup_state_kv_args
                            AFTER   both roles: the PD registration of asym_registration.py (layer ids
                                    on every entry; the prefill role registers only its payload)
  disaggregation.utils.get_kv_class
                            AROUND  asym-prefill on Mooncake: the exact-payload KV manager
                                    (exact_payload.py: the manifest's rows and nothing else)
  disaggregation.common.conn.get_dsv41_spec_layout
                            REPLACE both roles: no symmetric DSpark PD layout to match at the handshake
                                    (an asym-decode D that speculates drafts from its own window;
                                    asym_registration.py)
  disaggregation.prefill.PrefillBootstrapQueue.add
                            AROUND  asym-prefill: cuts each fresh request to its first B = N - W
                                    tokens (prefill_cut.py) before SGLang checks capacity, creates
                                    the KV sender and queues it, and tells the KV manager the room's
                                    split; N <= W is cut to nothing and marked zero-compute;
                                    logprobs are refused with a 400
  PrefillBootstrapQueue.can_prefill_before_bootstrap, .pop_bootstrapped,
  SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue
                            AROUND  asym-prefill: a zero-compute request concludes its room with one
                                    empty send and no forward (prefill_zero.py)
  SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run
                            AROUND  asym-prefill: a prompt in chunked prefill whose room failed goes
                                    to SGLang's chunked-abort path before its next chunk (prefill_stop.py)
  disaggregation.decode: DecodePreallocQueue._swa_tail_len, ._send_kv_metadata,
  DecodeTransferQueue._commit_transfer_to_req,
  SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run, ._get_new_prebuilt_batch
                            AROUND  asym-decode: SWA slots and destinations for B, P's placeholder
                                    dropped, the window
                                    [B, N) as EXTEND chunks riding in the decode forward under the
                                    budget policy (asym_decode.py)
  DecodePreallocQueue.pop_preallocated, DecodeTransferQueue.pop_transferred, Scheduler.abort_request
                            AROUND  asym-decode with --asym-transfer-fallback recompute: a failed
                                    handshake or transfer is recomputed on D, unless its client aborted
                                    it (transfer_fallback.py)
  MooncakeTransferEngine.register, .deregister, .batch_register, .batch_deregister
                            AROUND  both roles: Mooncake regions counted on /metrics
                                    (mooncake_regions.py)

`prepare_server_args` is what both `python -m sglang.launch_server` and `sglang serve` call after
`load_plugins()`; HookRegistry also rebinds the stale `from ... import prepare_server_args` copy
that `sglang.launch_server` (run as __main__) holds.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any, Callable

from ..config import V41Config
from . import (admission, asym_decode, cpu_import_gaps, exact_payload, mooncake_regions, prefill_refusal,
               prefill_stop, prefill_zero, transfer_fallback)
from .cpu_engine_mode import CHILD_FLAG, cpu_engine_selected
from .asym_registration import apply_asym_registration, no_symmetric_dspark_layout
from .cli import extend_parser, translate
from .liveness import liveness_health_default
from .prefill_cut import cut_request, logprobs_refusal, prefill_cut_for, prompt_len_of
from .prefill_cut_hook import install_prefill_cut
from .prefill_model import install_prefill_loading, truncated_construction
from ..split import SplitPlan
from .prefill_role import PrefillRole
from .settings import attach, settings_of
from .servable import check_servable
from .startup import STARTUP_GAPS
from .validation import AsymArgumentError

SERVER_ARGS = "sglang.srt.server_args"
ADD_CLI_ARGS = f"{SERVER_ARGS}.ServerArgs.add_cli_args"
FROM_CLI_ARGS = f"{SERVER_ARGS}.ServerArgs.from_cli_args"
PREPARE_SERVER_ARGS = f"{SERVER_ARGS}.prepare_server_args"
PUBLISH = "sglang.srt.runtime_context.publish"
INITIALIZE_MODEL = "sglang.srt.model_loader.loader._initialize_model"
SETUP_STATE_KV_ARGS = "sglang.srt.disaggregation.utils.setup_state_kv_args"
DSPARK_PD_LAYOUT = "sglang.srt.disaggregation.common.conn.get_dsv41_spec_layout"
GET_KV_CLASS = "sglang.srt.disaggregation.utils.get_kv_class"
PREFILL_QUEUE_ADD = "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.add"
PREFILL_EARLY = "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.can_prefill_before_bootstrap"
PREFILL_POP_BOOTSTRAPPED = "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.pop_bootstrapped"
PREFILL_INFLIGHT = ("sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin."
                    "process_disagg_prefill_inflight_queue")
PREFILL_NEXT_BATCH = ("sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin."
                      "get_next_disagg_prefill_batch_to_run")
DECODE = "sglang.srt.disaggregation.decode"
DECODE_SWA_TAIL = f"{DECODE}.DecodePreallocQueue._swa_tail_len"
DECODE_SEND_METADATA = f"{DECODE}.DecodePreallocQueue._send_kv_metadata"
DECODE_COMMIT = f"{DECODE}.DecodeTransferQueue._commit_transfer_to_req"
DECODE_NEXT_BATCH = f"{DECODE}.SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run"
DECODE_PREBUILT_BATCH = f"{DECODE}.SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch"
DECODE_POP_PREALLOCATED = f"{DECODE}.DecodePreallocQueue.pop_preallocated"
DECODE_POP_TRANSFERRED = f"{DECODE}.DecodeTransferQueue.pop_transferred"
SCHEDULER_ABORT = "sglang.srt.managers.scheduler.Scheduler.abort_request"
MOONCAKE_ENGINE = "sglang.srt.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine"
SCHEDULER_ROLE = "scheduler"
TOKENIZER_ROLE = "tokenizer"  # the launcher process: HTTP front and tokenizer manager
MOONCAKE_PROTOCOL_ENV = "MOONCAKE_PROTOCOL"
DIST_NAME = "sglang-asym"

log = logging.getLogger(__name__)


def after_add_cli_args(result: Any, parser: Any) -> None:
    extend_parser(parser)


def around_from_cli_args(original: Callable, cls: type, args: Any) -> Any:
    check_servable(getattr(args, "model_path", None))
    settings = translate(args)
    server_args = original(cls, args)
    if settings is not None:
        attach(server_args, settings)
        admission.environment_defaults(settings.request_deadline_s)
        liveness_health_default()
    return server_args


def around_prepare_server_args(original: Callable, argv: list[str]) -> Any:
    try:
        server_args = original(argv)
    except AsymArgumentError as exc:
        # Same shape and status as argparse's own usage errors.
        sys.stderr.write(f"sglang-asym: error: {exc}\n")
        raise SystemExit(2) from None
    return server_args


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


def after_publish(result: Any, server_args: Any, *args: Any, role: str | None = None, **kwargs: Any) -> None:
    if role in (TOKENIZER_ROLE, SCHEDULER_ROLE) and settings_of(server_args) is not None:
        from .cuda_guards import refuse_unhandled_cuda_settings

        refuse_unhandled_cuda_settings(server_args, settings_of(server_args))  # the resolved record, CUDA only
    if role == TOKENIZER_ROLE and settings_of(server_args) is not None:
        from .admission_check import install_admission_check
        from .drain import install_drain_refusal

        admission.register_admission()  # applied with the drain refusal's hooks (one generate_request chain)
        install_drain_refusal()
        install_admission_check()
    if role != SCHEDULER_ROLE:
        return
    asymmetric = settings_of(server_args) is not None
    if asymmetric:  # registered first: some share a target with a CPU patch, applied together below
        register_scheduler_hooks()
    if cpu_engine_selected():
        from .cpu_patches import SCHEDULER as SCHEDULER_PROCESS, apply_cpu_patches

        apply_cpu_patches(SCHEDULER_PROCESS)
    if asymmetric:
        install_scheduler_hooks()


def after_setup_state_kv_args(result: Any, kv_args: Any, token_to_kv_pool: Any, *args: Any, **kwargs: Any) -> None:
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
    from sglang.srt.runtime_context import get_server_args

    server_args = get_server_args()
    settings = settings_of(server_args)
    if settings is None or not isinstance(token_to_kv_pool, DeepSeekV4TokenToKVPool):
        return
    apply_asym_registration(kv_args, token_to_kv_pool, V41Config.from_json_file(server_args.model_path), settings)
    if settings.is_prefill:  # the exact-payload manager reads the rows' slots from this pool
        setattr(kv_args, exact_payload.POOL_ATTR, token_to_kv_pool)


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
        prefill_refusal.relay_refusal(queue.kv_manager, req.bootstrap_room, getattr(reason, "message", str(reason)))
        return original(queue, req, *args, **kwargs)
    # a re-queued request keeps its cut
    if settings is None or not settings.is_prefill or prompt_len_of(req) is not None:
        return original(queue, req, *args, **kwargs)
    refusal = None
    try:
        cfg = _model_config(queue.scheduler.model_config.model_path)  # the model this scheduler serves
        n = len(req.origin_input_ids)
        cut = prefill_cut_for(cfg, settings, n)
        if req.return_logprob:
            refusal = (HTTPStatus.BAD_REQUEST, logprobs_refusal(n, req.logprob_start_len, settings))
        else:
            cut_request(req, cut)
            if not cut.runs_forward:
                prefill_zero.mark_zero_compute(req)
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
    prefill_refusal.relay_refusal(queue.kv_manager, req.bootstrap_room, message)
    prepare_abort(req, message, status_code=status)
    queue.scheduler.output_streamer.stream_output([req], req.return_logprob)
    return None


def hook_table() -> tuple[tuple[str, Callable, str], ...]:
    """(target, hook, HookType name) for every hook; the canary tests check each target."""
    return (
        (ADD_CLI_ARGS, after_add_cli_args, "AFTER"),
        (FROM_CLI_ARGS, around_from_cli_args, "AROUND"),
        (PREPARE_SERVER_ARGS, around_prepare_server_args, "AROUND"),
        (PUBLISH, after_publish, "AFTER"),
    )


def scheduler_hook_table() -> tuple[tuple[str, Callable, str], ...]:
    """Hooks installed only in an asymmetric server's scheduler processes (see after_publish)."""
    return (
        (INITIALIZE_MODEL, around_initialize_model, "AROUND"),
        (SETUP_STATE_KV_ARGS, after_setup_state_kv_args, "AFTER"),
        (GET_KV_CLASS, exact_payload.around_get_kv_class, "AROUND"),
        (DSPARK_PD_LAYOUT, no_symmetric_dspark_layout, "REPLACE"),
        (PREFILL_QUEUE_ADD, around_prefill_queue_add, "AROUND"),
        (PREFILL_EARLY, prefill_zero.around_can_prefill_before_bootstrap, "AROUND"),
        (PREFILL_POP_BOOTSTRAPPED, prefill_zero.around_pop_bootstrapped, "AROUND"),
        (PREFILL_INFLIGHT, prefill_zero.around_process_inflight, "AROUND"),
        (PREFILL_NEXT_BATCH, prefill_stop.around_next_prefill_batch, "AROUND"),
        (DECODE_SWA_TAIL, asym_decode.around_swa_tail_len, "AROUND"),
        (DECODE_SEND_METADATA, asym_decode.around_send_kv_metadata, "AROUND"),
        (DECODE_COMMIT, asym_decode.around_commit_transfer_to_req, "AROUND"),
        (DECODE_NEXT_BATCH, asym_decode.around_get_next_decode_batch, "AROUND"),
        (DECODE_PREBUILT_BATCH, asym_decode.around_get_new_prebuilt_batch, "AROUND"),
        (DECODE_POP_PREALLOCATED, transfer_fallback.around_pop_preallocated, "AROUND"),
        (DECODE_POP_TRANSFERRED, transfer_fallback.around_pop_transferred, "AROUND"),
        (SCHEDULER_ABORT, transfer_fallback.around_abort_request, "AROUND"),
        (f"{MOONCAKE_ENGINE}.register", mooncake_regions.around_register, "AROUND"),
        (f"{MOONCAKE_ENGINE}.deregister", mooncake_regions.around_deregister, "AROUND"),
        (f"{MOONCAKE_ENGINE}.batch_register", mooncake_regions.around_batch_register, "AROUND"),
        (f"{MOONCAKE_ENGINE}.batch_deregister", mooncake_regions.around_batch_deregister, "AROUND"),
    )


def register_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if cpu_engine_selected():
        # SGLang's own engine on CPU: this process and every one it spawns gets the import stand-ins
        os.environ[CHILD_FLAG] = "1"
        os.environ.setdefault(MOONCAKE_PROTOCOL_ENV, "tcp")  # PD transfer over TCP unless told otherwise
        cpu_import_gaps.install(STARTUP_GAPS)
        from .cpu_patches import LAUNCHER, apply_cpu_patches

        apply_cpu_patches(LAUNCHER, apply_now=False)  # load_plugins applies it with every other hook

    for target, hook, hook_type in hook_table():
        HookRegistry.register(target, hook, HookType[hook_type])


def register_scheduler_hooks() -> None:
    """Registers scheduler_hook_table() without applying it. Idempotent."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType

    from . import ENTRY_POINT_NAME
    from .cpu_patches import is_registered

    for target, hook, hook_type in scheduler_hook_table():
        if not is_registered(target, hook):
            HookRegistry.register(target, hook, HookType[hook_type], source=HookSource(ENTRY_POINT_NAME, DIST_NAME))


def install_scheduler_hooks() -> None:
    """Registers and applies scheduler_hook_table(). Idempotent."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    register_scheduler_hooks()
    HookRegistry.apply_hooks()
    missing = [target for target, _, _ in scheduler_hook_table() if target not in HookRegistry._patched]
    if missing:
        raise RuntimeError(f"sglang-asym could not apply its scheduler hooks to {missing} (see the log above)")
