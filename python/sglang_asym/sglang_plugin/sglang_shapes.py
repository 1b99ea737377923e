"""A small V4.1 config that SGLang 0.5.23 accepts on every path the plugin exercises on CPU.

SGLang's V4.1 cache pools (the FlashMLA `v41` / `v41_fp4` layouts) require head_dim 512 (448 nope +
64 rope) and 128-dim index keys: the core's `small` preset (head_dim 64) builds SGLang's model but not
its KV pool. `sglang_small()` keeps `small`'s 40-layer role schedule (KV sources 2/8/14/20, window
128), width and router, with the release's attention and index-key geometry, 16 routed experts (the
checkpoint stays ~70 MB) and the release's bf16 model dtype.

Its config.json also carries the `quantization_config` SGLang's ModelConfig reads to load the released
layout as block FP8 (32x32, ue8m0 scales); SGLang detects the FP4 routed experts from the tensors.
Without it SGLang treats the checkpoint as unquantized and its loader refuses the FP8 tensors.
"""

from __future__ import annotations

import json

from ..config import V41Config

RELEASE_QUANTIZATION_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "weight_block_size": [32, 32],
    "activation_scheme": "dynamic",
}


def with_release_quantization(cfg: V41Config) -> V41Config:
    """cfg whose config.json also carries RELEASE_QUANTIZATION_CONFIG."""
    extra = json.loads(cfg.extra)
    extra.setdefault("outer", {})["quantization_config"] = RELEASE_QUANTIZATION_CONFIG
    extra.setdefault("text", {})
    return cfg.replace(extra=json.dumps(extra, sort_keys=True))


def sglang_small() -> V41Config:
    return with_release_quantization(V41Config.small().replace(
        head_dim=512,
        qk_rope_head_dim=64,
        index_head_dim=128,
        n_routed_experts=16,
        dtype="bfloat16",
    ))
