"""The SGLang symbols the plugin hooks, and what each hook does.

  ServerArgs.add_cli_args   AFTER   add the asymmetric modes and --asym-* flags (so --help lists them)
  ServerArgs.from_cli_args  AROUND  refuse a V4.1 checkpoint SGLang's pool cannot hold (shared/servable.py, every
                                    mode); validate + translate asym-* to prefill/decode, attach AsymSettings;
                                    on CPU an asym-prefill launcher turns on Triton's CPU interpreter for
                                    its schedulers (cpu_platform/server_defaults.py)
  prepare_server_args       AROUND  argument errors as argparse-style exits
  runtime_context.publish   AFTER   on CUDA, an asymmetric server's launcher and schedulers refuse the
                                    settings the path does not handle (shared/cuda_guards.py); in a
                                    scheduler process: on CPU, applies cpu_platform/patches.py (SGLang's
                                    own engine on CPU); for an asymmetric ServerArgs, registers and
                                    applies the scheduler hooks below (in that process only: their
                                    modules do not import on a CPU-only launcher), and for SGLang's own
                                    prefill mode only get_kv_class's (STOCK_PREFILL_HOOKS: the
                                    room lifecycle, shared/room_lifecycle.py); in the launcher
                                    process of an asymmetric server, the drain refusal (shared/drain.py:
                                    TokenizerManager.generate_request AROUND, 503 after SIGTERM),
                                    admission control with request deadlines (shared/admission.py:
                                    TokenizerManager.__init__ AFTER, .generate_request AROUND,
                                    CommonKVBootstrapServer._setup_routes AFTER, http_server.
                                    _create_error_response AFTER for Retry-After) and
                                    the refusals both roles make alike before any bootstrap
                                    (shared/admission_check.py: TokenizerManager._init_req_state AROUND),
                                    and P's refusals relayed to D answered with P's 4xx, not a 500
                                    (shared/relayed_refusal.py: TokenizerManager._handle_abort_finish_reason
                                    AROUND; OpenAIServingBase.create_error_response AROUND, P's 503)
  ServerArgs.from_cli_args also sets, for an asym server, the environment defaults its processes
                                    inherit: the PD waits bounded by --asym-request-deadline-s
                                    (shared/admission.py) and /health as liveness (shared/liveness.py)
Scheduler hooks (each target and the SGLang code it relies on: test_asym_engine_canaries.py), one table
per room, installed together by install_scheduler_hooks():
  shared (SCHEDULER_HOOKS below):
  disaggregation.utils.setup_state_kv_args
                            AFTER   both roles: the PD registration of shared/pd_registration.py (layer
                                    ids on every entry; the prefill role registers only its payload)
  disaggregation.common.conn.get_dsv41_spec_layout
                            REPLACE both roles: no symmetric DSpark PD layout to match at the handshake
                                    (an asym-decode D that speculates drafts from its own window)
  MooncakeTransferEngine.register, .deregister, .batch_register, .batch_deregister
                            AROUND  both roles: Mooncake regions counted on /metrics
                                    (shared/mooncake_regions.py)
  prefill/hooks.py HOOKS    what P adds (the model build, the intake cut, zero-compute, stopped rooms)
  decode/hooks.py HOOKS     what D adds (destinations for B, the window step, the recompute fallback)
The CPU route's patches are a table of their own (cpu_platform/patches.py, CPU_PATCHES), applied in every
process of a CPU-engine server.

`prepare_server_args` is what both `python -m sglang.launch_server` and `sglang serve` call after
`load_plugins()`; HookRegistry also rebinds the stale `from ... import prepare_server_args` copy
that `sglang.launch_server` (run as __main__) holds.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from ..config import V41Config
from .cpu_platform import import_gaps as cpu_import_gaps
from .cpu_platform.cpu_patch import register_missing
from .cpu_platform.engine_mode import CHILD_FLAG, cpu_engine_selected
from .cpu_platform.server_defaults import prefill_environment
from .cpu_platform.startup import STARTUP_GAPS
from .decode.hooks import HOOKS as DECODE_HOOKS
from .prefill import exact_payload
from .prefill.hooks import HOOKS as PREFILL_HOOKS, STOCK_PREFILL_HOOKS
from .shared import admission, mooncake_regions
from .shared.cli import extend_parser, translate
from .shared.liveness import liveness_health_default
from .shared.pd_registration import apply_asym_registration, no_symmetric_dspark_layout
from .shared.servable import check_servable
from .shared.settings import attach, settings_of
from .shared.validation import AsymArgumentError

SERVER_ARGS = "sglang.srt.server_args"
ADD_CLI_ARGS = f"{SERVER_ARGS}.ServerArgs.add_cli_args"
FROM_CLI_ARGS = f"{SERVER_ARGS}.ServerArgs.from_cli_args"
PREPARE_SERVER_ARGS = f"{SERVER_ARGS}.prepare_server_args"
PUBLISH = "sglang.srt.runtime_context.publish"
SETUP_STATE_KV_ARGS = "sglang.srt.disaggregation.utils.setup_state_kv_args"
DSPARK_PD_LAYOUT = "sglang.srt.disaggregation.common.conn.get_dsv41_spec_layout"
MOONCAKE_ENGINE = "sglang.srt.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine"
SCHEDULER_ROLE = "scheduler"
TOKENIZER_ROLE = "tokenizer"  # the launcher process: HTTP front and tokenizer manager
MOONCAKE_PROTOCOL_ENV = "MOONCAKE_PROTOCOL"
ENTRY_POINT_NAME = "sglang_asym"  # in the entry-point group `sglang.srt.plugins` (pyproject.toml)
DIST_NAME = "sglang-asym"


def after_add_cli_args(result: Any, parser: Any) -> None:
    extend_parser(parser)


def around_from_cli_args(original: Callable, cls: type, args: Any) -> Any:
    check_servable(getattr(args, "model_path", None))
    settings = translate(args)
    server_args = original(cls, args)
    if settings is not None:
        attach(server_args, settings)
        admission.environment_defaults(settings.request_deadline_s)
        prefill_environment(settings)
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


def after_publish(result: Any, server_args: Any, *args: Any, role: str | None = None, **kwargs: Any) -> None:
    if role in (TOKENIZER_ROLE, SCHEDULER_ROLE) and settings_of(server_args) is not None:
        from .shared.cuda_guards import refuse_unhandled_cuda_settings

        refuse_unhandled_cuda_settings(server_args, settings_of(server_args))  # the resolved record, CUDA only
    if role == TOKENIZER_ROLE and settings_of(server_args) is not None:
        from .shared.admission_check import install_admission_check
        from .shared.drain import install_drain_refusal
        from .shared.relayed_refusal import install_relayed_refusal

        admission.register_admission()  # applied with the drain refusal's hooks (one generate_request chain)
        install_drain_refusal()
        install_admission_check()
        install_relayed_refusal()
    if role != SCHEDULER_ROLE:
        return
    asymmetric = settings_of(server_args) is not None
    table = scheduler_hook_table() if asymmetric else \
        STOCK_PREFILL_HOOKS if server_args.disaggregation_mode == "prefill" else ()
    # registered first: some share a target with a CPU patch, applied together below
    register_missing(table, source=(ENTRY_POINT_NAME, DIST_NAME))
    if cpu_engine_selected():
        from .cpu_platform.patches import SCHEDULER as SCHEDULER_PROCESS, apply_cpu_patches

        apply_cpu_patches(SCHEDULER_PROCESS)
    if table:
        install_hooks(table)


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


def hook_table() -> tuple[tuple[str, Callable, str], ...]:
    """(target, hook, HookType name) for every hook; the canary tests check each target."""
    return (
        (ADD_CLI_ARGS, after_add_cli_args, "AFTER"),
        (FROM_CLI_ARGS, around_from_cli_args, "AROUND"),
        (PREPARE_SERVER_ARGS, around_prepare_server_args, "AROUND"),
        (PUBLISH, after_publish, "AFTER"),
    )


SCHEDULER_HOOKS: tuple[tuple[str, Callable, str], ...] = (
    (SETUP_STATE_KV_ARGS, after_setup_state_kv_args, "AFTER"),
    (DSPARK_PD_LAYOUT, no_symmetric_dspark_layout, "REPLACE"),
    (f"{MOONCAKE_ENGINE}.register", mooncake_regions.around_register, "AROUND"),
    (f"{MOONCAKE_ENGINE}.deregister", mooncake_regions.around_deregister, "AROUND"),
    (f"{MOONCAKE_ENGINE}.batch_register", mooncake_regions.around_batch_register, "AROUND"),
    (f"{MOONCAKE_ENGINE}.batch_deregister", mooncake_regions.around_batch_deregister, "AROUND"),
)


def scheduler_hook_table() -> tuple[tuple[str, Callable, str], ...]:
    """Hooks installed only in an asymmetric server's scheduler processes (see after_publish): the shared
    room's, the prefill room's and the decode room's tables."""
    return SCHEDULER_HOOKS + PREFILL_HOOKS + DECODE_HOOKS


def register_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if cpu_engine_selected():
        # SGLang's own engine on CPU: this process and every one it spawns gets the import stand-ins
        os.environ[CHILD_FLAG] = "1"
        os.environ.setdefault(MOONCAKE_PROTOCOL_ENV, "tcp")  # PD transfer over TCP unless told otherwise
        cpu_import_gaps.install(STARTUP_GAPS)
        from .cpu_platform.patches import LAUNCHER, apply_cpu_patches

        apply_cpu_patches(LAUNCHER, apply_now=False)  # load_plugins applies it with every other hook

    for target, hook, hook_type in hook_table():
        HookRegistry.register(target, hook, HookType[hook_type])


def install_scheduler_hooks() -> None:
    """Registers and applies scheduler_hook_table(). Idempotent."""
    install_hooks(scheduler_hook_table())


def install_hooks(table: tuple[tuple[str, Callable, str], ...]) -> None:
    """Registers and applies `table`; refuses to go on when SGLang could not patch one of its targets. Idempotent."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    register_missing(table, source=(ENTRY_POINT_NAME, DIST_NAME))
    HookRegistry.apply_hooks()
    missing = [target for target, _, _ in table if target not in HookRegistry._patched]
    if missing:
        raise RuntimeError(f"sglang-asym could not apply its scheduler hooks to {missing} (see the log above)")
