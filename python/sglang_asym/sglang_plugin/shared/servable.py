"""Refuses, in the launcher, a DeepSeek-V4.1 checkpoint whose geometry SGLang 0.5.23's V4.1 cache pool cannot hold.

Without this check the scheduler child dies on a bare `AssertionError` inside SGLang's pool
(`DeepSeekV4TokenToKVPool.get_bytes_per_token`: `qk_nope_head_dim + qk_rope_head_dim == 512`) and the
launcher exits with a traceback that does not say what is wrong with the checkpoint. Every pool layout SGLang
builds for V4.1 stores 512-dim main-KV rows; the `v4` layout (the one SGLang picks on an H200) splits them
into a 448-dim FP8 nope part and a 64-dim bf16 rope part. `V41Config.sglang_small()` (the
`--config sglang-small` preset of scripts/make_checkpoint.py) is a small config that passes.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...config import ConfigError, V41_ARCHITECTURE, V41_MODEL_TYPES, V41Config
from .validation import AsymArgumentError

# (V41Config field, the value SGLang's V4.1 pool needs, why)
POOL_GEOMETRY = (
    ("head_dim", 512, "every V4.1 pool layout stores 512-dim main-KV rows (qk_nope_head_dim + qk_rope_head_dim)"),
    ("qk_rope_head_dim", 64, "the v4 pool layout stores a 448-dim FP8 nope part and a 64-dim bf16 rope part"),
)


def declares_v41(config_json: dict) -> bool:
    """Whether a config.json (outer dict) names DeepSeek-V4.1, by model type or architecture."""
    text = config_json.get("text_config") if isinstance(config_json.get("text_config"), dict) else {}
    types = {config_json.get("model_type"), text.get("model_type")}
    return bool(types & set(V41_MODEL_TYPES)) or V41_ARCHITECTURE in (config_json.get("architectures") or ())


def pool_geometry_problems(config: V41Config) -> tuple[str, ...]:
    """One sentence per field SGLang's V4.1 pool cannot hold, naming the field, its value and the value needed."""
    return tuple(f"{field} is {getattr(config, field)}, SGLang's V4.1 cache pool needs {field} = {needed} ({why})"
                 for field, needed, why in POOL_GEOMETRY if getattr(config, field) != needed)


def check_servable(model_path: str | None) -> None:
    """Raises AsymArgumentError for a local V4.1 checkpoint SGLang cannot serve; anything else passes through
    untouched (other models, hub names, and unreadable configs are SGLang's own business)."""
    if not model_path:
        return
    path = Path(model_path) / "config.json"
    if not path.is_file():
        return
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return
    if not isinstance(raw, dict) or not declares_v41(raw):
        return
    try:
        config = V41Config.from_hf_dict(raw)
    except ConfigError as exc:
        raise AsymArgumentError(f"{path} is not a valid DeepSeek-V4.1 config: {exc}") from None
    problems = pool_geometry_problems(config)
    if problems:
        raise AsymArgumentError(
            f"{model_path} cannot be served by SGLang: " + "; ".join(problems)
            + ". scripts/make_checkpoint.py --config sglang-small writes a small checkpoint SGLang serves")
