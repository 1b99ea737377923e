"""The `quantization_config` a release-precision checkpoint's config.json carries for SGLang's loader.

SGLang's ModelConfig reads it to build the block-FP8 model (E4M3 weights, one ue8m0 scale per 32x32
block); without it SGLang builds an unquantized model and its loader refuses the FP8 tensors. SGLang
detects the FP4 routed experts from the tensors themselves. Our own config loader keeps the key as an
unmodelled extra (V41Config.extra), so a round trip preserves it.
"""

from __future__ import annotations

import json
from typing import Any

from ..config import V41Config
from .formats import BLOCK
from .specs import PRECISIONS

QUANTIZATION_KEY = "quantization_config"
RELEASE_QUANTIZATION_CONFIG: dict[str, Any] = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "weight_block_size": [BLOCK, BLOCK],
    "activation_scheme": "dynamic",
}


def _with_outer(cfg: V41Config, update) -> V41Config:
    extra = json.loads(cfg.extra)
    outer = dict(extra.get("outer", {}))
    update(outer)
    extra["outer"] = outer
    extra.setdefault("text", {})
    return cfg.replace(extra=json.dumps(extra, sort_keys=True))


def quantization_config_of(cfg: V41Config) -> dict[str, Any] | None:
    """The top-level quantization_config cfg's config.json carries, if any."""
    return json.loads(cfg.extra).get("outer", {}).get(QUANTIZATION_KEY)


def with_release_quantization(cfg: V41Config) -> V41Config:
    """cfg whose config.json carries RELEASE_QUANTIZATION_CONFIG; cfg itself when it already has a
    quantization_config (so applying it twice, or to a loaded release config.json, changes nothing)."""
    if quantization_config_of(cfg) is not None:
        return cfg
    return _with_outer(cfg, lambda outer: outer.__setitem__(QUANTIZATION_KEY, RELEASE_QUANTIZATION_CONFIG))


def without_quantization(cfg: V41Config) -> V41Config:
    """cfg whose config.json carries no quantization_config (its tensors are plain floats)."""
    if quantization_config_of(cfg) is None:
        return cfg
    return _with_outer(cfg, lambda outer: outer.pop(QUANTIZATION_KEY))


def config_for_precision(cfg: V41Config, precision: str) -> V41Config:
    """The config written next to tensors at `precision`: release tensors are block FP8 (+ FP4 experts) and
    need the quantization_config; bf16 / fp32 tensors must not claim it, or SGLang would expect FP8."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return with_release_quantization(cfg) if precision == "release" else without_quantization(cfg)
