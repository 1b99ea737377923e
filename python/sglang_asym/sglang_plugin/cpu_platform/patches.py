"""Every change SGLang 0.5.23 needs to serve DeepSeek-V4.1 on a CPU machine, in one place.

Each entry of `CPU_PATCHES` names the SGLang symbol, the kind of change, the process it matters in
(the launcher, which also runs the tokenizer manager and HTTP server, or a scheduler) and why.
`apply_cpu_patches(process)` applies that process's entries, only when the CPU engine is selected
(engine_mode.py); test_canaries.py checks every target against the pinned SGLang, so an upgrade
fails loudly instead of serving wrong bytes.

Launcher:
  chat_encoding.resolve_chat_encoding_spec       AROUND   a checkpoint whose tokenizer lacks DeepSeek's
                        chat special tokens (the small generated checkpoints) keeps its own chat
                        template instead of DeepSeek's reference encoder, which cannot encode for it
  TokenizerManager._validate_one_request         AROUND   refuse token ids outside the model's vocabulary
                        with a 400 (SGLang does not check them, and one would crash the scheduler); under
                        --speculative-algorithm DSPARK also sampled (non-greedy) and constrained (grammar)
                        requests: the CPU engine's DSpark worker verifies drafts by argmax (dspark_worker.py)
  speculative_hook._handle_dspark                AROUND   SGLang refuses DSpark on any device but cuda / npu /
                        xpu before asking the platform; on this platform (which serves it, platform.py) its
                        checks run with that one gate passed, and overlap scheduling is turned off as SGLang
                        does for EAGLE and NGRAM on CPU (_disable_overlap_schedule_for_cpu)
Scheduler:
  kv_cache_configurator.reject_out_of_tree_path  AROUND   let the DeepSeek-V4 KV pool be built on this
                        platform: it is plain torch tensors on "cpu" (every other refusal stays)
  deepseek_v4_memory_pool.select_dsv4_kv_layout  REPLACE  the pool layout: SGLANG_DSV4_KV_LAYOUT=v4 or
                        v41; `auto` (the default) takes v41, what SGLang picks on a B300 (SM103)
  DeepseekV4AttnBackend.init_forward_metadata    REPLACE  no FlashMLA / DeepGEMM metadata, only the cache-write
                        locations P's layer-L KV writes read (cpu_ops.py); the reference layers read the pool
                        through ForwardBatch themselves
  layernorm.mhc.mhc_combine                      REPLACE  the mHC combine in torch (cpu_ops.py): SGLang's Triton
                        kernel, under Triton's CPU interpreter, truncates where a GPU rounds to nearest
  DeepSeekV4TokenToKVPool.set_extra_key_buffer_fused  REPLACE  the compressed-KV store of P's layer L in
                        torch (cpu_ops.py): SGLang's is a JIT-CUDA kernel that does not build without CUDA
  dsv4_fp4_index_k_cache.store_fp4_index_k_cache  REPLACE  the fp4 index-key store of P's layer L in torch
                        (cpu_ops.py), byte for byte SGLang's two Triton kernels, which the CPU interpreter
                        runs one Python program per row (59% of P's time on a 2,000-token prompt)
  DeepseekV4AttnBackend._snapshot_prefill_shared_reads  REPLACE  the base backend's (nothing to snapshot)
  MooncakeKVSender.supports_host_tensor_indices  ATTRIBUTE False: P's send path would pin host memory
                        and record a torch.cuda.Event for indices that are already on the host
  ForwardBatch.init_new                          AROUND   hand the reference layers each request's
                        prompt length by req slot (it applies SGLang's replay floors from it) and the
                        runner's pools (the ForwardBatch the model sees may be a copy: no attributes)
  DecodeTransferQueue._commit_transfer_to_req    AFTER    a test aid, a no-op unless SGLANG_ASYM_POOL_DUMP_DIR
                        is set: dump the rows D received (shared/pool_dump.py)
  rope_variant.get_device                        REPLACE  "cpu" (it raises without an accelerator)
  rotary_embedding.factory.get_rope_wrapper      AROUND   the generic rope for device "cpu": the CPU
                        branch only knows deepseek_yarn scaling, and V4.1's ratio-0 layers have none
                        (the model's rope objects are built, never run: the reference layers rope)
  DeepseekV4ForCausalLM._prewarm_mhc_kernels     REPLACE  no JIT prewarm of CUDA mHC kernels
  allocation.assign_req_to_token_pool_func       REPLACE  torch (spec_slots.py): SGLang's Triton kernel, or
                        its in-tree CPU engine's sgl-kernel op, writes the slots of a speculative decode step
  allocation.get_last_loc                        REPLACE  SGLang's own get_last_loc_torch: a speculative decode
                        step's paged allocation asks for each request's last slot through a Triton kernel
                        unless the attention backend is torch_native (V4.1's is dsv4)
  SchedulerDisaggregationPrefillMixin.maybe_send_cached_prefix_chunk  AROUND  P's early send of a chunked
                        prompt's computed prefix without a torch.cuda.Event (it raised on CPU, and P's
                        scheduler died at the second chunk of every prompt longer than --chunked-prefill-size):
                        the CPU forward is synchronous, so the previous chunk's rows are written before the
                        next step starts and there is nothing to wait for
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable

from .cpu_patch import LAUNCHER, SCHEDULER, CpuPatch, is_registered
from .deterministic import deterministic_patches
from .kv_layout import cpu_kv_layout_name

log = logging.getLogger(__name__)

DSV4_POOL_SUBSYSTEM = "the DeepSeek-V4 KV pool"

MEMORY_POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
ATTN_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend"


DEEPSEEK_CHAT_SPECS = ("dsv4", "dsv41")
DEEPSEEK_SYSTEM_TOKEN = "<\uff5cSystem\uff5c>"  # the first special token DeepSeek's encoder needs


def _deferred(module: str, name: str) -> Callable:
    """`module`'s `name` (a module relative to this package, or SGLang's own), imported at its first call."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module, __package__), name)(*args, **kwargs)

    call.__qualname__ = f"{module.lstrip('.')}.{name}"
    return call


def select_cpu_kv_layout() -> tuple[Any, None]:
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

    return KVLayout.parse(cpu_kv_layout_name()), None


def around_resolve_chat_encoding_spec(original: Callable, *args: Any, **kwargs: Any) -> Any:
    spec = original(*args, **kwargs)
    tokenizer = kwargs.get("tokenizer")
    if spec in DEEPSEEK_CHAT_SPECS and tokenizer is not None and \
            DEEPSEEK_SYSTEM_TOKEN not in tokenizer.get_added_vocab():
        log.warning("sglang-asym: the tokenizer has no DeepSeek chat special tokens; chat prompts use its own "
                    "chat template instead of DeepSeek's encoder (%s)", spec)
        return None
    return spec


CONSTRAINED_DECODING_PARAMS = ("json_schema", "regex", "ebnf", "structural_tag")


def refuse_sampled_speculation(manager: Any, obj: Any) -> None:
    """A 400 for a sampled or constrained request to a DSpark server: the CPU engine's DSpark verifies drafts
    by argmax, without a grammar mask."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algorithm = getattr(manager.server_args, "speculative_algorithm", None)  # the name, as server_args keeps it
    if isinstance(algorithm, str):
        algorithm = SpeculativeAlgorithm.from_string(algorithm)
    if algorithm is None or not algorithm.is_dspark():
        return
    sampling = getattr(obj, "sampling_params", None) or {}
    for params in sampling if isinstance(sampling, list) else [sampling]:
        temperature, top_k = params.get("temperature", 1.0), params.get("top_k", -1)
        if not (temperature == 0 or top_k == 1):
            raise ValueError("speculative decoding (DSPARK) on sglang-asym's CPU engine serves greedy requests only: "
                             f"send temperature 0 (got temperature {temperature}, top_k {top_k})")
        constrained = [name for name in CONSTRAINED_DECODING_PARAMS if params.get(name) is not None]
        if constrained:
            raise ValueError("speculative decoding (DSPARK) on sglang-asym's CPU engine does not serve constrained "
                             f"decoding ({', '.join(constrained)})")


def around_validate_one_request(original: Callable, manager: Any, obj: Any, input_ids: Any, *args: Any,
                                **kwargs: Any) -> Any:
    result = original(manager, obj, input_ids, *args, **kwargs)
    vocab_size = manager.model_config.vocab_size
    for index, token in enumerate(input_ids or ()):
        if not 0 <= int(token) < vocab_size:
            raise ValueError(f"input_ids[{index}] = {int(token)} is outside the model's vocabulary [0, {vocab_size})")
    refuse_sampled_speculation(manager, obj)
    return result


def around_handle_dspark(original: Callable, server_args: Any) -> Any:
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.arg_groups.speculative_hook import _disable_overlap_schedule_for_cpu
    from sglang.srt.platforms import current_platform

    if resolving_view(server_args).device != "cpu" or not current_platform.supports_speculative_algorithm("DSPARK"):
        return original(server_args)
    _disable_overlap_schedule_for_cpu(server_args)
    # the gate reads the resolved device: a declaration that lasts for this call only (the last writer wins)
    gate = ("sglang_asym:dspark_device_gate", {"device": "cuda"})
    stash = getattr(server_args, "_resolved_overrides", None)
    if stash is None:
        stash = server_args._resolved_overrides = []
    stash.append(gate)
    try:
        return original(server_args)
    finally:
        stash[:] = [entry for entry in stash if entry is not gate]


def around_reject_out_of_tree_path(original: Callable, platform: Any, *, subsystem: str) -> None:
    if subsystem == DSV4_POOL_SUBSYSTEM:
        return None
    return original(platform, subsystem=subsystem)


def base_snapshot_prefill_shared_reads(backend: Any, forward_batch: Any, *, num_qo_tokens: int) -> Any:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    return AttentionBackend._snapshot_prefill_shared_reads(backend, forward_batch, num_qo_tokens=num_qo_tokens)


def around_forward_batch_init_new(original: Callable, cls: type, batch: Any, model_runner: Any, *args: Any,
                                  **kwargs: Any) -> Any:
    from .reference_forward import note_schedule_batch

    note_schedule_batch(batch, model_runner)
    return original(cls, batch, model_runner, *args, **kwargs)


def cpu_device(*args: Any, **kwargs: Any) -> str:
    return "cpu"


def around_get_rope_wrapper(original: Callable, *args: Any, **kwargs: Any) -> Any:
    if kwargs.get("device") == "cpu":
        kwargs["device"] = None
    return original(*args, **kwargs)


def no_mhc_prewarm(model: Any) -> None:
    return None


class _SchedulerWithoutOverlap:
    """A scheduler seen with `enable_overlap` False (every other attribute is the scheduler's own)."""

    enable_overlap = False

    def __init__(self, scheduler: Any) -> None:
        object.__setattr__(self, "_scheduler", scheduler)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._scheduler, name, value)


def around_send_cached_prefix_chunk(original: Callable, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    # under overlap SGLang records a CUDA event for the transfer worker to wait on the previous forward's writes
    return original(_SchedulerWithoutOverlap(scheduler), *args, **kwargs)


CPU_PATCHES: tuple[CpuPatch, ...] = (
    CpuPatch("sglang.srt.entrypoints.openai.chat_encoding.resolve_chat_encoding_spec", "AROUND",
             around_resolve_chat_encoding_spec, "generated checkpoints chat with their own template", LAUNCHER),
    CpuPatch("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", "AROUND",
             around_validate_one_request, "out-of-vocabulary ids get a 400", LAUNCHER),
    CpuPatch("sglang.srt.arg_groups.speculative_hook._handle_dspark", "AROUND", around_handle_dspark,
             "DSpark's device gate on this platform", LAUNCHER),
    CpuPatch("sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func", "REPLACE",
             _deferred(".spec_slots", "assign_req_to_token_pool"), "speculative slots written in torch"),
    CpuPatch("sglang.srt.mem_cache.allocation.get_last_loc", "REPLACE",
             _deferred("sglang.srt.mem_cache.allocation", "get_last_loc_torch"),
             "a speculative step's last slots found in torch"),
    CpuPatch("sglang.srt.mem_cache.kv_cache_configurator.reject_out_of_tree_path", "AROUND",
             around_reject_out_of_tree_path, "build the DeepSeek-V4 pool on CPU"),
    CpuPatch(f"{MEMORY_POOL}.select_dsv4_kv_layout", "REPLACE", select_cpu_kv_layout,
             "v41 (B300's choice) or v4 by SGLANG_DSV4_KV_LAYOUT"),
    CpuPatch(f"{ATTN_BACKEND}.init_forward_metadata", "REPLACE", _deferred(".cpu_ops", "low_ratio_forward_metadata"),
             "only the cache-write locations of P's layer-L KV writes"),
    CpuPatch("sglang.kernels.ops.layernorm.mhc.mhc_combine", "REPLACE", _deferred(".cpu_ops", "combine_in_torch"),
             "the mHC combine, rounded as on a GPU"),
    CpuPatch(f"{MEMORY_POOL}.DeepSeekV4TokenToKVPool.set_extra_key_buffer_fused", "REPLACE",
             _deferred(".cpu_ops", "store_compressed_kv"), "the compressed-KV store without its JIT-CUDA kernel"),
    CpuPatch("sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache.store_fp4_index_k_cache", "REPLACE",
             _deferred(".cpu_ops", "store_fp4_index_k_in_torch"),
             "the fp4 index-key store without Triton's interpreter"),
    CpuPatch(f"{ATTN_BACKEND}._snapshot_prefill_shared_reads", "REPLACE", base_snapshot_prefill_shared_reads,
             "nothing to snapshot"),
    CpuPatch("sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.supports_host_tensor_indices", "ATTRIBUTE",
             False, "no pinned memory or CUDA events in P's send path"),
    CpuPatch("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", "AROUND",
             around_forward_batch_init_new, "prompt lengths for the replay floors"),
    CpuPatch("sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req", "AFTER",
             _deferred("..shared.pool_dump", "after_commit_transfer"), "test aid: D's received rows"),
    CpuPatch("sglang.srt.layers.rotary_embedding.rope_variant.get_device", "REPLACE", cpu_device,
             "the rope factory's device lookup"),
    CpuPatch("sglang.srt.layers.rotary_embedding.factory.get_rope_wrapper", "AROUND", around_get_rope_wrapper,
             "the generic rope on CPU"),
    CpuPatch("sglang.srt.models.deepseek_v4.DeepseekV4ForCausalLM._prewarm_mhc_kernels", "REPLACE",
             no_mhc_prewarm, "no CUDA mHC prewarm"),
    CpuPatch("sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.maybe_send_cached_prefix_chunk",
             "AROUND", around_send_cached_prefix_chunk, "P's early prefix send without a CUDA event"),
)


def _set_attribute(target: str, value: Any) -> None:
    module_path, cls_name, attr = target.rsplit(".", 2)
    cls = getattr(importlib.import_module(module_path), cls_name)
    if not hasattr(cls, attr):
        raise RuntimeError(f"{target} does not exist: the pinned SGLang changed")
    setattr(cls, attr, value)


_applied: set[str] = set()


def apply_cpu_patches(process: str = SCHEDULER, apply_now: bool = True) -> None:
    """Registers and applies the CPU_PATCHES of `process` in this process. Idempotent. With
    `apply_now=False` (inside SGLang's load_plugins, which applies every hook after the plugins ran)
    the hooks are only registered."""
    if process in _applied:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    cpu_kv_layout_name()  # a bad SGLANG_DSV4_KV_LAYOUT fails here, before any process starts serving

    mine = [p for p in CPU_PATCHES if p.process == process] + deterministic_patches(process)
    hooked = [p for p in mine if p.kind != "ATTRIBUTE"]
    for patch in hooked:
        if not is_registered(patch.target, patch.hook):
            HookRegistry.register(patch.target, patch.hook, HookType[patch.kind])
    for patch in mine:
        if patch.kind == "ATTRIBUTE":
            _set_attribute(patch.target, patch.hook)
    _applied.add(process)
    if not apply_now:
        return
    HookRegistry.apply_hooks()
    missing = [p.target for p in hooked if p.target not in HookRegistry._patched]
    if missing:
        raise RuntimeError(f"sglang-asym could not apply its CPU patches to {missing} (see the log above)")
    log.info("sglang-asym: %d CPU patches applied to SGLang's %s", len(mine), process)
