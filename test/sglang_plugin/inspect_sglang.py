"""Writes what SGLang 0.5.23 makes of a V4.1 config, as JSON, from a dedicated CPU process:

  parameters   SGLang's DeepseekV4ForCausalLM parameters (name, shape, dtype) on the meta device
  remap        SGLang's own rename of every released checkpoint tensor name
  kv_pools     DeepSeekV4TokenToKVPool's PD buffer layout, for the v41 and v4 KV layouts
  prefill_role the prefill role's truncated model (meta device) after SGLang's `load_weights` took
               the whole released checkpoint (meta tensors of every stored name) through the role's
               filter: its parameters, the names the filter passed, and SGLang's load log
  signatures   parameter names of the SGLang callables this relies on (the canary tests pin them)
  relied_on    facts of SGLang's code the truncation, the scheduler hooks and the registration rely on

    python test/sglang_plugin/inspect_sglang.py --preset flash --out sglang_flash.json
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect as pyinspect
import json
import logging
import sys
import time
from pathlib import Path

from meta_model import released_tensor_names
from sglang_asym.config import V41Config
from sglang_on_cpu import build_kv_pool, pool_buffer_layout, sglang_cpu_context

KV_LAYOUTS = ("v41", "v4")


def _signatures() -> dict[str, list[str]]:
    import sglang.srt.layers.rotary_embedding.rope_variant as rope_variant
    import sglang.srt.models.deepseek_v4 as deepseek_v4
    from sglang.srt.layers.engram import EngramHasher
    from sglang.srt.disaggregation import utils as disagg_utils
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.model_loader import loader
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM

    model, pool = DeepseekV4ForCausalLM, DeepSeekV4TokenToKVPool
    callables = {
        "DeepseekV4ForCausalLM.__init__": model.__init__,
        "DeepseekV4ForCausalLM.load_weights": model.load_weights,
        "DeepseekV4ForCausalLM.post_load_weights": model.post_load_weights,
        "DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format": model.remap_weight_name_to_dpsk_hf_format,
        "EngramHasher.from_config": EngramHasher.from_config,
        "rope_variant.get_device": rope_variant.get_device,
        "DeepSeekV4TokenToKVPool.__init__": pool.__init__,
        "DeepSeekV4TokenToKVPool.pd_kv_layout": pool.pd_kv_layout,
        "DeepSeekV4TokenToKVPool.get_contiguous_buf_infos": pool.get_contiguous_buf_infos,
        "DeepSeekV4TokenToKVPool.get_state_buf_infos": pool.get_state_buf_infos,
        "DeepSeekV4TokenToKVPool.get_request_state_buf_infos": pool.get_request_state_buf_infos,
        "loader._initialize_model": loader._initialize_model,
        "disaggregation.utils.setup_state_kv_args": disagg_utils.setup_state_kv_args,
        "disaggregation.utils.build_transfer_entry_pairs": disagg_utils.build_transfer_entry_pairs,
        "MooncakeKVManager._send_kvcache_generic": MooncakeKVManager._send_kvcache_generic,
        "MooncakeKVManager.send_kvcache": MooncakeKVManager.send_kvcache,
        "MooncakeKVManager.maybe_send_extra": MooncakeKVManager.maybe_send_extra,
        "deepseek_v4.make_pp_layers": deepseek_v4.make_pp_layers,
        "deepseek_v4.ParallelLMHead.__init__": deepseek_v4.ParallelLMHead.__init__,
        "deepseek_v2.DeepseekV2MoE.__init__": deepseek_v4.deepseek_v2.DeepseekV2MoE.__init__,
        "PrefillBootstrapQueue.add": PrefillBootstrapQueue.add,
        "disaggregation.utils.prepare_abort": disagg_utils.prepare_abort,
        "disaggregation.utils.is_unadmitted_reject": disagg_utils.is_unadmitted_reject,
    }
    return {name: list(pyinspect.signature(fn).parameters) for name, fn in callables.items()}


def _relied_on_code() -> dict[str, bool]:
    """What the prefill role's truncation relies on in SGLang's V4 model code (prefill_model.py) and
    in the scheduler's model loading (the publish and _initialize_model hooks)."""
    import sglang.srt.models.deepseek_v4 as deepseek_v4
    from sglang.srt.managers.scheduler import run_scheduler_process
    from sglang.srt.model_loader import loader

    def src(obj: object) -> str:
        return pyinspect.getsource(obj)

    model, causal = deepseek_v4.DeepseekV4Model, deepseek_v4.DeepseekV4ForCausalLM
    base = deepseek_v4.DeepseekV4DecoderLayerBase
    scheduler = src(run_scheduler_process)
    from sglang.srt.disaggregation.decode import DecodePreallocQueue
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue

    def ids_then_state_args(init) -> bool:
        text = src(init)
        return text.index("kv_args.kv_layer_ids = build_kv_layer_ids(") < text.index("setup_state_kv_args(")

    from sglang.srt.managers.scheduler import Scheduler

    add = src(PrefillBootstrapQueue.add)
    return {
        # the intake hook (prefill_cut.py) cuts before these read the prompt length
        "prefill queue add: reject check, then create_sender, then queue":
            add.index("is_unadmitted_reject(req)") < add.index("self.create_sender(req") < add.index("self.queue.append(req)"),
        "create_sender checks capacity on len(req.origin_input_ids) before creating the sender":
            "len(req.origin_input_ids) > self.max_input_len" in src(PrefillBootstrapQueue._check_if_req_exceed_kv_capacity)
            and src(PrefillBootstrapQueue.create_sender).index("_check_if_req_exceed_kv_capacity")
            < src(PrefillBootstrapQueue.create_sender).index("kv_sender_class("),
        "pages to send are counted from len(req.origin_input_ids)":
            "len(req.origin_input_ids) - decode_prefix_len" in src(PrefillBootstrapQueue._num_pages_to_send),
        "prefill scheduler queues new requests through disagg_prefill_bootstrap_queue.add":
            "self.disagg_prefill_bootstrap_queue.add(" in src(Scheduler._add_request_to_queue),
        "prefill and decode set kv_layer_ids before setup_state_kv_args":
            ids_then_state_args(PrefillBootstrapQueue._init_kv_manager)
            and ids_then_state_args(DecodePreallocQueue._init_kv_manager),
        "send_kvcache pairs the KV entries by kv_layer_ids":
            "src_layer_ids=self.kv_args.kv_layer_ids" in src(MooncakeKVManager.send_kvcache),
        "maybe_send_extra pairs the state entries by state_layer_ids":
            "src_state_layer_ids = self.kv_args.state_layer_ids" in src(MooncakeKVManager.maybe_send_extra),
        "scheduler loads plugins, then publishes its ServerArgs with role 'scheduler'":
            scheduler.index("load_plugins()") < scheduler.index("publish(\n        server_args,")
            and 'role="scheduler"' in scheduler,
        "_initialize_model builds model_class(**kwargs) from config and quant_config":
            "model = model_class(**kwargs)" in src(loader._initialize_model)
            and '"config": model_config.hf_config' in src(loader._initialize_model)
            and '"quant_config": quant_config' in src(loader._initialize_model),
        "the default loader builds through _initialize_model":
            "model = _initialize_model(" in src(loader.DefaultModelLoader.load_model),
        "the default loader feeds the instance's load_weights":
            "model.load_weights(weights)" in src(loader.DefaultModelLoader.load_weights_only),
        "model builds its layers through the module's make_pp_layers":
            "self.layers, self.start_layer, self.end_layer = make_pp_layers(" in src(model.__init__),
        "causal LM builds its head through the module's ParallelLMHead":
            "self.lm_head = ParallelLMHead(" in src(causal.__init__),
        "decoder layer builds its MoE through deepseek_v2.DeepseekV2MoE":
            "self.mlp = deepseek_v2.DeepseekV2MoE(" in src(base.__init__),
        "load_weights skips layers outside [start_layer, end_layer)":
            "layer_id < self.model.start_layer" in src(causal.load_weights)
            and "layer_id >= self.model.end_layer" in src(causal.load_weights),
        "load_weights calls self.post_load_weights":
            "self.post_load_weights(is_nextn=is_nextn, weight_names=weight_names)" in src(causal.load_weights),
        "post_load_weights refreshes layers in range(start_layer, end_layer)":
            "for layer_id in range(self.model.start_layer, self.model.end_layer):" in src(causal.post_load_weights),
        "mega attention set-up is gated by use_mega_attention":
            "if not self.use_mega_attention:" in src(deepseek_v4.MQALayer.setup_mega_attention),
        "combine() reads the hyper-connection's cfg and norm with a previous pre-mix":
            "cfg, norm = hc.cfg, hc.norm" in src(deepseek_v4.mhc._combine),
    }


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname}: {record.getMessage()}")


def _released_checkpoint_on_meta(cfg: V41Config):
    """(name, meta tensor) for every tensor a released checkpoint stores (DSpark and Engram included)."""
    import torch

    from sglang_asym.checkpoint.specs import checkpoint_tensor_specs, disk_layout

    for spec in checkpoint_tensor_specs(cfg):
        for stored in disk_layout(spec, "release"):
            yield stored.name, torch.empty(stored.shape, dtype=stored.dtype, device="meta")


def inspect_prefill_role(cfg: V41Config, quantized: bool) -> dict:
    """Needs sglang_cpu_context."""
    from meta_model import build_model, cpu_adjustments, parameter_table
    from sglang_asym.sglang_plugin.prefill.role import PrefillRole

    role = PrefillRole.from_config(cfg)
    model = build_model(cfg, "meta", quantized, role=role)
    parameters = [[p.name, list(p.shape), p.dtype] for p in parameter_table(model)]
    records = _Records()
    sglang_log = logging.getLogger("sglang.srt.models.deepseek_v4")
    level = sglang_log.level
    sglang_log.addHandler(records)
    sglang_log.setLevel(logging.INFO)
    try:
        with cpu_adjustments():
            model.load_weights(_released_checkpoint_on_meta(cfg))
    finally:
        sglang_log.removeHandler(records)
        sglang_log.setLevel(level)
    stats = model._sglang_asym_prefill_load_stats
    return {
        "parameters": parameters,
        "passed": sorted(stats.passed),
        "skipped": stats.skipped,
        "sglang_log": records.messages,
        "layers": [type(layer).__name__ for layer in model.model.layers],
        "layer_range": [model.start_layer, model.end_layer],
        "head_and_norm": [type(model.lm_head).__name__, type(model.model.norm).__name__],
    }


def inspect(cfg: V41Config, quantized: bool) -> dict:
    with sglang_cpu_context():
        import sglang
        from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM

        from meta_model import build_meta_model, parameter_table

        start = time.perf_counter()
        model = build_meta_model(cfg, quantized=quantized)
        build_seconds = time.perf_counter() - start
        remap = {
            name: DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format(
                name, num_hidden_layers=cfg.num_hidden_layers
            )
            for name in released_tensor_names(cfg)
        }
        pools = {layout: dataclasses.asdict(pool_buffer_layout(build_kv_pool(cfg, kv_layout=layout)))
                 for layout in KV_LAYOUTS}
        return {
            "sglang_version": sglang.__version__,
            "quantized": quantized,
            "build_seconds": round(build_seconds, 2),
            "parameters": [[p.name, list(p.shape), p.dtype] for p in parameter_table(model)],
            "remap": remap,
            "kv_pools": pools,
            "prefill_role": inspect_prefill_role(cfg, quantized),
            "signatures": _signatures(),
            "relied_on": _relied_on_code(),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python test/sglang_plugin/inspect_sglang.py")
    parser.add_argument("--preset", default="flash", help="V41Config preset (tiny, small, flash)")
    parser.add_argument("--config", help="a config.json instead of a preset")
    parser.add_argument("--unquantized", action="store_true", help="build without the release's FP8/FP4 config")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    cfg = V41Config.from_json_file(args.config) if args.config else V41Config.preset(args.preset)
    report = inspect(cfg, quantized=not args.unquantized)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"{len(report['parameters'])} SGLang parameters, built in {report['build_seconds']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
