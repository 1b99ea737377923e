"""V41Config: the DeepSeek-V4.1 text configuration, HF config.json in and out, and presets.

Field names are the Hugging Face `text_config` names of the released checkpoint. A config.json
may nest them under `text_config` (the released layout, with `model_type: deepseek_v41`) or keep
them flat at the top level; `from_hf_dict` reads both and `to_hf_dict` writes the nested layout.
Keys this project does not model (vision, quantization metadata, ...) are kept verbatim in
`extra` so a round trip loses nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

V41_MODEL_TYPES = ("deepseek_v41", "deepseek_v41_text")
V41_ARCHITECTURE = "DeepseekV41ForCausalLM"
# W: the released sliding window, and the default window the decode role computes (--asym-window).
# The one place the number is written: every default window of the package comes from here.
DEFAULT_WINDOW = 128

_FLASH_RATIOS = (0, 0) + (2,) * 18 + (1,) * 20 + (0,) * 3
_FLASH_KV_SOURCES = (2, 8, 14, 20)
_FLASH_INDEX_SOURCES = (2, 8, 14, 20, 24, 28, 32, 36)
_DEFAULT_YARN = (
    ("beta_fast", 32),
    ("beta_slow", 1),
    ("factor", 16),
    ("original_max_position_embeddings", 65536),
    ("rope_type", "yarn"),
)


class ConfigError(ValueError):
    """A config that is not a valid DeepSeek-V4.1 text configuration."""


@dataclass(frozen=True)
class V41Config:
    vocab_size: int = 129280
    hidden_size: int = 5120
    moe_intermediate_size: int = 2304
    num_hidden_layers: int = 40
    num_attention_heads: int = 64
    num_key_value_heads: int = 1
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1280
    o_lora_rank: int = 1024
    o_groups: int = 8
    swiglu_limit: float = 10.0
    rms_norm_eps: float = 1e-20
    max_position_embeddings: int = 1048576
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = _DEFAULT_YARN
    n_routed_experts: int = 384
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    scoring_func: str = "sqrtsoftplus"
    topk_method: str = "noaux_tc"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.5
    sliding_window: int = DEFAULT_WINDOW
    compress_ratios: tuple[int, ...] = _FLASH_RATIOS
    compress_rope_theta: float = 160000.0
    kv_source_layer_ids: tuple[int, ...] = _FLASH_KV_SOURCES
    index_source_layer_ids: tuple[int, ...] = _FLASH_INDEX_SOURCES
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    candidate_source_layer_id: int = 20
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    engram_layer_ids: tuple[int, ...] = (1, 14)
    engram_num_embeddings: tuple[int, ...] = (384006168, 384016682)
    engram_max_ngram_size: int = 4
    engram_n_heads: int = 8
    engram_head_dim: int = 256
    num_nextn_predict_layers: int = 3
    dspark_block_size: int = 5
    dspark_target_layer_ids: tuple[int, ...] = (37, 38, 39)
    dspark_markov_rank: int = 256
    dspark_n_routed_experts: int = 128
    dspark_num_experts_per_tok: int = 3
    dspark_noise_token_id: int = 128799
    bos_token_id: int = 0
    eos_token_id: int = 1
    pad_token_id: int = 2
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    # Unmodelled config.json keys, kept as sorted JSON for an exact round trip.
    extra: str = field(default="{}", compare=False)

    def __post_init__(self) -> None:
        _validate(self)

    # ---- derived facts -------------------------------------------------------------------
    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling)

    @property
    def last_kv_source(self) -> int:
        """The last layer that produces compressed KV and index keys (20 in Flash)."""
        return max(self.kv_source_layer_ids)

    @property
    def layer_ratios(self) -> tuple[int, ...]:
        return self.compress_ratios[: self.num_hidden_layers]

    def fingerprint(self) -> str:
        """Stable hash of every modelled field: the handshake's model compatibility check."""
        payload = json.dumps(self.to_hf_dict(include_extra=False), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> "V41Config":
        return dataclasses.replace(self, **changes)

    # ---- HF config.json -------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> "V41Config":
        if not isinstance(raw, dict):
            raise ConfigError(f"config must be a JSON object, got {type(raw).__name__}")
        model_type = raw.get("model_type")
        if model_type is not None and model_type not in V41_MODEL_TYPES:
            raise ConfigError(
                f"config.json has model_type {model_type!r}; sglang-asym serves only DeepSeek-V4.1 "
                f"(model_type {V41_MODEL_TYPES[0]!r})"
            )
        archs = raw.get("architectures")
        if archs is not None and V41_ARCHITECTURE not in archs:
            raise ConfigError(f"config.json architectures {archs} do not include {V41_ARCHITECTURE}")
        text = raw.get("text_config")
        if text is None:
            text, outer = dict(raw), {}
        elif isinstance(text, dict):
            outer = {k: v for k, v in raw.items() if k != "text_config"}
        else:
            raise ConfigError("text_config must be a JSON object")
        if "compress_ratios" not in text or "kv_source_layer_ids" not in text:
            raise ConfigError(
                "config is not a DeepSeek-V4.1 text config: it lacks compress_ratios / kv_source_layer_ids"
            )
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs: dict[str, Any] = {}
        unknown_text: dict[str, Any] = {}
        for key, value in text.items():
            if key == "torch_dtype":
                key = "dtype"
            if key in known:
                kwargs[key] = _coerce(key, value)
            elif key != "model_type":
                unknown_text[key] = value
        for key in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"):
            if key not in kwargs and key in outer:
                kwargs[key] = outer[key]
        outer = {k: v for k, v in outer.items() if k not in ("model_type", "architectures")}
        extra = {"outer": outer, "text": unknown_text}
        return cls(**kwargs, extra=json.dumps(extra, sort_keys=True, default=str))

    def to_hf_dict(self, include_extra: bool = True) -> dict[str, Any]:
        text: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if f.name == "rope_scaling":
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            text[f.name] = value
        text["model_type"] = "deepseek_v41_text"
        extra = json.loads(self.extra) if include_extra else {"outer": {}, "text": {}}
        text.update(extra.get("text", {}))
        out: dict[str, Any] = dict(extra.get("outer", {}))
        out.update(
            {
                "architectures": [V41_ARCHITECTURE],
                "model_type": "deepseek_v41",
                "text_config": text,
                "bos_token_id": self.bos_token_id,
                "eos_token_id": self.eos_token_id,
                "pad_token_id": self.pad_token_id,
                "tie_word_embeddings": self.tie_word_embeddings,
                "dtype": self.dtype,
            }
        )
        return out

    @classmethod
    def from_json_file(cls, path: str | Path) -> "V41Config":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"no config.json at {path}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        try:
            return cls.from_hf_dict(raw)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        path.write_text(json.dumps(self.to_hf_dict(), indent=2, sort_keys=True) + "\n")
        return path

    # ---- presets ---------------------------------------------------------------------------
    @classmethod
    def flash(cls) -> "V41Config":
        """The released DeepSeek-V4.1-Flash sizes (meta device only)."""
        return cls()

    @classmethod
    def tiny(cls) -> "V41Config":
        """Unit-test size with every layer role: SWA-only, ratio-2 Full + Reuse (two owners),
        ratio-1 Full/candidate source, Reuse, Reindex, Reuse. Window 128 as released."""
        return cls(
            vocab_size=512,
            hidden_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=9,
            num_attention_heads=4,
            head_dim=64,
            qk_rope_head_dim=16,
            q_lora_rank=32,
            o_lora_rank=16,
            o_groups=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=8192,
            rope_scaling=(("beta_fast", 32), ("beta_slow", 1), ("factor", 4),
                          ("original_max_position_embeddings", 1024), ("rope_type", "yarn")),
            n_routed_experts=8,
            num_experts_per_tok=2,
            compress_ratios=(0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0),
            kv_source_layer_ids=(1, 3, 5),
            index_source_layer_ids=(1, 3, 5, 7),
            index_n_heads=32,
            index_head_dim=32,
            index_topk=16,
            candidate_source_layer_id=5,
            candidate_topk_blocks=8,
            candidate_block_size=4,
            engram_layer_ids=(),
            engram_num_embeddings=(),
            num_nextn_predict_layers=2,
            dspark_target_layer_ids=(6, 7, 8),
            dspark_n_routed_experts=8,
            dspark_num_experts_per_tok=2,
            dspark_markov_rank=16,
            dspark_noise_token_id=500,
            dtype="float32",
        )

    @classmethod
    def small(cls) -> "V41Config":
        """The real 40-layer role schedule and window 128 at a width that runs on 2 CPU cores.
        Experts dominate the weights, as in Flash, so the prefill role's footprint is measurable."""
        return cls(
            vocab_size=1024,
            hidden_size=256,
            moe_intermediate_size=128,
            num_hidden_layers=40,
            num_attention_heads=4,
            head_dim=64,
            qk_rope_head_dim=16,
            q_lora_rank=64,
            o_lora_rank=32,
            o_groups=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=16384,
            rope_scaling=(("beta_fast", 32), ("beta_slow", 1), ("factor", 4),
                          ("original_max_position_embeddings", 4096), ("rope_type", "yarn")),
            n_routed_experts=128,
            num_experts_per_tok=2,
            index_n_heads=16,
            index_head_dim=32,
            index_topk=64,
            candidate_topk_blocks=16,
            candidate_block_size=8,
            engram_layer_ids=(),
            engram_num_embeddings=(),
            num_nextn_predict_layers=3,
            dspark_n_routed_experts=16,
            dspark_num_experts_per_tok=2,
            dspark_markov_rank=32,
            dspark_noise_token_id=1000,
            dtype="float32",
        )

    @classmethod
    def sglang_small(cls) -> "V41Config":
        """`small` at the attention and index-key geometry SGLang's V4.1 cache pool holds (head_dim 512 =
        448 nope + 64 rope, 128-dim index keys), 16 routed experts (~70 MB at release precision) and the
        release's bf16 model dtype: the smallest preset `python -m sglang.launch_server` can serve."""
        return cls.small().replace(head_dim=512, qk_rope_head_dim=64, index_head_dim=128, n_routed_experts=16,
                                   dtype="bfloat16")

    @classmethod
    def sglang_tiny(cls) -> "V41Config":
        """`tiny` (its nine layers of every role) at the attention and index-key geometry SGLang's V4.1 cache pool
        holds (head_dim 512 = 448 nope + 64 rope, 128-dim index keys), in the release's bf16 model dtype: the
        smallest config SGLang's engine serves, and the one the trained model has."""
        return cls.tiny().replace(head_dim=512, qk_rope_head_dim=64, index_head_dim=128, dtype="bfloat16")

    @classmethod
    def preset(cls, name: str) -> "V41Config":
        presets = {"tiny": cls.tiny, "small": cls.small, "sglang-small": cls.sglang_small,
                   "sglang-tiny": cls.sglang_tiny, "flash": cls.flash}
        if name not in presets:
            raise ConfigError(f"unknown config preset {name!r}; choose one of {sorted(presets)}")
        return presets[name]()


_TUPLE_FIELDS = {
    "compress_ratios", "kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids",
    "engram_num_embeddings", "dspark_target_layer_ids",
}


def _coerce(key: str, value: Any) -> Any:
    if key in _TUPLE_FIELDS:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return tuple(value)
    if key == "rope_scaling":
        if value is None:
            return ()
        if not isinstance(value, dict):
            raise ConfigError(f"rope_scaling must be an object, got {value!r}")
        return tuple(sorted(value.items()))
    return value


def _validate(c: V41Config) -> None:
    def positive_int(name: str) -> None:
        value = getattr(c, name)
        if type(value) is not int or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")

    for name in (
        "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
        "head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "n_routed_experts", "num_experts_per_tok",
        "sliding_window", "index_n_heads", "index_head_dim", "index_topk", "hc_mult", "hc_sinkhorn_iters",
        "max_position_embeddings",
    ):
        positive_int(name)
    if c.num_key_value_heads != 1:
        raise ConfigError("DeepSeek-V4.1 shares one latent KV head: num_key_value_heads must be 1")
    if c.n_shared_experts != 1:
        raise ConfigError("DeepSeek-V4.1 has exactly one shared expert: n_shared_experts must be 1")
    if c.num_attention_heads % c.o_groups:
        raise ConfigError("num_attention_heads must be divisible by o_groups")
    if c.qk_rope_head_dim <= 0 or c.qk_rope_head_dim % 2 or c.qk_rope_head_dim > min(c.head_dim, c.index_head_dim):
        raise ConfigError("qk_rope_head_dim must be positive, even and <= head_dim and index_head_dim")
    if c.num_experts_per_tok > c.n_routed_experts:
        raise ConfigError("num_experts_per_tok must not exceed n_routed_experts")
    if c.scoring_func != "sqrtsoftplus" or c.topk_method != "noaux_tc":
        raise ConfigError("DeepSeek-V4.1 routes with scoring_func 'sqrtsoftplus' and topk_method 'noaux_tc'")
    for name in ("rms_norm_eps", "hc_eps", "rope_theta", "compress_rope_theta", "routed_scaling_factor",
                 "swiglu_limit"):
        value = getattr(c, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} must be finite and positive, got {value!r}")
    if len(c.compress_ratios) < c.num_hidden_layers:
        raise ConfigError("compress_ratios must cover every layer")
    if any(type(r) is not int or r not in (0, 1, 2) for r in c.compress_ratios):
        raise ConfigError(f"compress_ratios must contain 0, 1 or 2, got {list(c.compress_ratios)}")
    for name in ("kv_source_layer_ids", "index_source_layer_ids"):
        ids = getattr(c, name)
        if not ids or list(ids) != sorted(set(ids)) or ids[-1] >= c.num_hidden_layers or ids[0] < 0:
            raise ConfigError(f"{name} must be strictly increasing layer ids within the model, got {list(ids)}")
    if not set(c.kv_source_layer_ids) <= set(c.index_source_layer_ids):
        raise ConfigError("every KV source layer must also be an index source layer")
    owner_ratio = None
    for layer, ratio in enumerate(c.layer_ratios):
        if ratio == 0:
            if layer in c.index_source_layer_ids:
                raise ConfigError(f"SWA-only layer {layer} cannot be a KV or index source")
            continue
        if layer in c.kv_source_layer_ids:
            owner_ratio = ratio
        if owner_ratio != ratio:
            raise ConfigError(f"compressed layer {layer} needs a preceding KV source with ratio {ratio}")
    if c.candidate_source_layer_id != c.last_kv_source:
        raise ConfigError("candidate_source_layer_id must be the last KV source layer")
    if c.compress_ratios[c.last_kv_source] != 1:
        raise ConfigError("the last KV source (candidate source) must have compression ratio 1")
    if any(c.compress_ratios[layer] == 0 for layer in range(c.last_kv_source, c.num_hidden_layers)):
        raise ConfigError("every layer from the last KV source on must read its compressed KV")
    if c.candidate_block_size <= 0 or c.candidate_topk_blocks <= 0:
        raise ConfigError("candidate_block_size and candidate_topk_blocks must be positive")
    if (c.candidate_topk_blocks - 1) * c.candidate_block_size + 1 < c.index_topk:
        raise ConfigError("(candidate_topk_blocks - 1) * candidate_block_size + 1 must be >= index_topk")
    if c.head_dim % 16 or c.index_head_dim % 32:
        raise ConfigError("head_dim must be a multiple of 16 and index_head_dim of 32 (cache row formats)")
    if not 0 <= c.bos_token_id < c.vocab_size or not 0 <= c.eos_token_id < c.vocab_size:
        raise ConfigError("bos_token_id and eos_token_id must lie inside the vocabulary")
    if c.tie_word_embeddings:
        raise ConfigError("DeepSeek-V4.1 has an untied fp32 head: tie_word_embeddings must be false")
    if len(c.engram_layer_ids) != len(c.engram_num_embeddings):
        raise ConfigError("engram_num_embeddings needs one row count per engram layer")
    if c.dtype not in ("bfloat16", "float32", "float16"):
        raise ConfigError(f"dtype must be bfloat16, float16 or float32, got {c.dtype!r}")
