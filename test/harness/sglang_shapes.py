"""A small V4.1 config that SGLang 0.5.23 accepts on every path the plugin exercises on CPU.

SGLang's V4.1 cache pools (the FlashMLA `v41` / `v41_fp4` layouts) require head_dim 512 (448 nope +
64 rope) and 128-dim index keys: the core's `small` preset (head_dim 64) builds SGLang's model but not
its KV pool. `sglang_small()` keeps `small`'s 40-layer role schedule (KV sources 2/8/14/20, window
128), width and router, with the release's attention and index-key geometry, 16 routed experts (the
checkpoint stays ~70 MB) and the release's bf16 model dtype.

Its config.json also carries the `quantization_config` SGLang's ModelConfig reads to load the released
layout as block FP8 (checkpoint/quantization.py; write_checkpoint adds it at release precision too).
"""

from __future__ import annotations

from sglang_asym.checkpoint.quantization import RELEASE_QUANTIZATION_CONFIG, with_release_quantization
from sglang_asym.config import V41Config

__all__ = ["RELEASE_QUANTIZATION_CONFIG", "sglang_small", "sglang_tiny", "with_release_quantization"]


def sglang_small() -> V41Config:
    return with_release_quantization(V41Config.sglang_small())


def sglang_tiny() -> V41Config:
    """The nine-layer tiny config (every layer role, window 128) at the same pool geometry: the system tests
    whose subject is the serving path rather than the 40-layer schedule run on it."""
    return with_release_quantization(V41Config.sglang_tiny())
