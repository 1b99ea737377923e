"""LayerPlan: each layer's role, where it reads compressed KV / index selections, and what the
prefill role must hold.

Roles (docs/v41-model.md, "Layer roles"): `swa` (ratio 0, window only), `full` (owns a compressor and index keys,
computes its own top-k), `full_candidate` (the last KV source: full + candidate blocks for the
reindex layers), `reindex` (own index query, scored inside the candidate blocks), `reuse` (reads
the latest selection and the latest KV source's rows). Encoder = layers before the last KV source;
the prefill role runs them completely and, of the last KV source, only the path that writes its
compressed rows and index keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .config import V41Config
from .tensor_specs import backbone_tensor_specs, layer_of


class Role(str, Enum):
    SWA = "swa"
    FULL = "full"
    FULL_CANDIDATE = "full_candidate"
    REINDEX = "reindex"
    REUSE = "reuse"


# From the last KV source the prefill role needs only the tensors that write its compressed rows
# and index keys: the stream collapse uses layer (L-1)'s FFN-site mix, then attn_norm -> compressor.
_KV_PATH_SUFFIXES = (
    "attn_norm.weight",
    "attn.compressor.wkv.weight",
    "attn.compressor.wgate.weight",
    "attn.compressor.norm.weight",
    "attn.indexer.wk.weight",
    "attn.indexer.k_norm.weight",
)


@dataclass(frozen=True)
class LayerInfo:
    index: int
    ratio: int
    role: Role
    kv_source: int | None  # layer whose compressed rows this layer attends (None for SWA-only)
    index_source: int | None  # layer whose top-k selection this layer uses
    is_encoder: bool

    @property
    def owns_kv(self) -> bool:
        return self.role in (Role.FULL, Role.FULL_CANDIDATE)

    @property
    def has_indexer(self) -> bool:
        return self.role in (Role.FULL, Role.FULL_CANDIDATE, Role.REINDEX)


@dataclass(frozen=True)
class LayerPlan:
    layers: tuple[LayerInfo, ...]
    last_kv_source: int
    prefill_tensor_names: frozenset[str]
    all_tensor_names: tuple[str, ...]

    @classmethod
    def from_config(cls, cfg: V41Config) -> "LayerPlan":
        last = cfg.last_kv_source
        infos = []
        kv_src = idx_src = None
        for i, ratio in enumerate(cfg.layer_ratios):
            if ratio == 0:
                infos.append(LayerInfo(i, 0, Role.SWA, None, None, i < last))
                continue
            if i in cfg.kv_source_layer_ids:
                kv_src = i
            if i in cfg.index_source_layer_ids:
                idx_src = i
            if i in cfg.kv_source_layer_ids:
                role = Role.FULL_CANDIDATE if i == cfg.candidate_source_layer_id else Role.FULL
            elif i in cfg.index_source_layer_ids:
                role = Role.REINDEX
            else:
                role = Role.REUSE
            infos.append(LayerInfo(i, ratio, role, kv_src, idx_src, i < last))
        names = tuple(s.name for s in backbone_tensor_specs(cfg))
        return cls(tuple(infos), last, frozenset(n for n in names if _prefill_needs(n, last)), names)

    @property
    def encoder_layers(self) -> tuple[int, ...]:
        return tuple(info.index for info in self.layers if info.is_encoder)

    @property
    def kv_owner_layers(self) -> tuple[int, ...]:
        return tuple(info.index for info in self.layers if info.owns_kv)

    @property
    def ratio2_owners(self) -> tuple[int, ...]:
        return tuple(info.index for info in self.layers if info.owns_kv and info.ratio == 2)


def _prefill_needs(name: str, last: int) -> bool:
    layer = layer_of(name)
    if layer is None:
        return name == "embed.weight"
    if layer < last:
        return True
    if layer == last:
        return name.removeprefix(f"layers.{layer}.") in _KV_PATH_SUFFIXES
    return False
