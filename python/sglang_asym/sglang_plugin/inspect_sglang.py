"""Writes what SGLang 0.5.23 makes of a V4.1 config, as JSON, from a dedicated CPU process:

  parameters   SGLang's DeepseekV4ForCausalLM parameters (name, shape, dtype) on the meta device
  remap        SGLang's own rename of every released checkpoint tensor name
  kv_pools     DeepSeekV4TokenToKVPool's PD buffer layout, for the v41 and v4 KV layouts
  signatures   parameter names of the SGLang callables this relies on (the canary tests pin them)

    python -m sglang_asym.sglang_plugin.inspect_sglang --preset flash --out sglang_flash.json
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect as pyinspect
import json
import sys
import time
from pathlib import Path

from ..config import V41Config
from .sglang_cpu import sglang_cpu_context
from .weight_names import released_tensor_names

KV_LAYOUTS = ("v41", "v4")


def _signatures() -> dict[str, list[str]]:
    import sglang.srt.layers.rotary_embedding.rope_variant as rope_variant
    from sglang.srt.layers.engram import EngramHasher
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
    }
    return {name: list(pyinspect.signature(fn).parameters) for name, fn in callables.items()}


def inspect(cfg: V41Config, quantized: bool) -> dict:
    with sglang_cpu_context():
        import sglang
        from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM

        from .kv_pool import build_kv_pool, pool_buffer_layout
        from .meta_model import build_meta_model, parameter_table

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
            "signatures": _signatures(),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_asym.sglang_plugin.inspect_sglang")
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
