"""Per-layer weight bytes, active parameters and KV read bytes of a V4.1 config, from the checkpoint specs.

The GPU step-time model needs, per layer: the routed experts' bytes (read only for the experts a step
touches), the bytes read whatever the batch (attention, shared expert, router, mHC), and the FLOPs one
token costs. They are counted from `checkpoint.specs` at released storage (the same tally
`footprint` uses), so the model and the memory fit agree byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..checkpoint.specs import checkpoint_tensor_specs, released_nbytes
from ..config import V41Config
from ..footprint import index_key_row_bytes, main_kv_row_bytes, swa_row_bytes
from ..layer_plan import LayerPlan
from ..tensor_specs import layer_of
from .steptime import Role

_ROUTED = re.compile(r"\.ffn\.experts\.\d+\.")


@dataclass(frozen=True)
class LayerWeights:
    """One decoder block: routed experts (all of them) and everything else, in bytes and parameters."""

    expert_bytes: int
    expert_params: int
    dense_bytes: int
    dense_params: int


@dataclass(frozen=True)
class AttentionCounts:
    """A role's layers grouped for the attention formulas: window layers, and per compress ratio the layers with
    compressed KV and the layers that compute indexer scores."""

    window_layers: int
    compressed: tuple[tuple[int, int], ...]  # (ratio, layers)
    indexed: tuple[tuple[int, int], ...]  # (ratio, layers)


def attention_counts(cfg: V41Config, layers: range) -> AttentionCounts:
    compressed: dict[int, int] = {}
    indexed: dict[int, int] = {}
    for layer in layers:
        ratio = cfg.compress_ratios[layer]
        if ratio > 0:
            compressed[ratio] = compressed.get(ratio, 0) + 1
            if layer in cfg.index_source_layer_ids:
                indexed[ratio] = indexed.get(ratio, 0) + 1
    return AttentionCounts(len(layers), tuple(sorted(compressed.items())), tuple(sorted(indexed.items())))


@dataclass(frozen=True, eq=False)
class FlashProfile:
    """What the step-time model needs from a config (counted once per config)."""

    cfg: V41Config
    layers: tuple[LayerWeights, ...]
    embed_bytes: int
    head_bytes: int
    head_params: int
    prefill_layers: int  # layers a P replica runs (0 .. last KV source - 1; layer 20's KV path is ~0.003%)
    prefill_counts: AttentionCounts
    full_counts: AttentionCounts
    late_counts: AttentionCounts

    @property
    def experts(self) -> int:
        return self.cfg.n_routed_experts

    def role_layers(self, role: Role) -> range:
        """Layers a forward of `role` runs (SYM_P: every layer, its late ones on fewer rows; see GpuStepModel)."""
        if role in (Role.ASYM_P, Role.RFC_P):
            return range(self.prefill_layers)
        if role is Role.LATE:
            return range(self.prefill_layers, len(self.layers))
        return range(len(self.layers))

    @staticmethod
    def runs_head(role: Role) -> bool:
        return role in (Role.FULL, Role.LATE, Role.SYM_P)

    def dense_bytes(self, role: Role) -> int:
        """Bytes read once per forward whatever the batch: dense weights of the role's layers (+ the head)."""
        total = sum(self.layers[i].dense_bytes for i in self.role_layers(role))
        return total + (self.head_bytes if self.runs_head(role) else 0)

    def expert_bytes(self, role: Role) -> int:
        return sum(self.layers[i].expert_bytes for i in self.role_layers(role))

    def weight_bytes(self, role: Role) -> int:
        return self.dense_bytes(role) + self.expert_bytes(role) + self.embed_bytes

    def active_params_per_token(self, role: Role) -> float:
        """Matmul parameters one token touches: dense ones, k of E routed experts; the head only for FULL."""
        k_over_e = self.cfg.num_experts_per_tok / self.experts
        per_layer = sum(self.layers[i].dense_params + k_over_e * self.layers[i].expert_params
                        for i in self.role_layers(role))
        return per_layer + (self.head_params if self.runs_head(role) else 0)

    def expert_flop_share(self, role: Role) -> float:
        """Share of a token's matmul FLOPs in routed experts (run at the FP4 rate where the GPU has one)."""
        k_over_e = self.cfg.num_experts_per_tok / self.experts
        experts = sum(k_over_e * self.layers[i].expert_params for i in self.role_layers(role))
        return experts / self.active_params_per_token(role)

    # ---- attention over the cache, per query row at context `ctx` ------------------------------------------
    def counts(self, role: Role) -> AttentionCounts:
        if role in (Role.ASYM_P, Role.RFC_P):
            return self.prefill_counts
        return self.late_counts if role is Role.LATE else self.full_counts

    def kv_read_bytes(self, ctx: int, role: Role) -> float:
        """Cache bytes one query row reads: its window rows (every layer), the top-k compressed rows it attends
        (layers with compressed KV) and every index key of the layers that compute indexer scores."""
        cfg, c = self.cfg, self.counts(role)
        total = c.window_layers * min(ctx, cfg.sliding_window) * swa_row_bytes(cfg)
        total += sum(n * min(cfg.index_topk, ctx // r) for r, n in c.compressed) * main_kv_row_bytes(cfg)
        total += sum(n * (ctx // r) for r, n in c.indexed) * index_key_row_bytes(cfg)
        return float(total)

    def attention_flops(self, ctx: int, role: Role) -> float:
        """FLOPs of one query row's attention: QK and PV over the attended rows, plus indexer scores."""
        cfg, c = self.cfg, self.counts(role)
        rows = c.window_layers * min(ctx, cfg.sliding_window) + sum(n * min(cfg.index_topk, ctx // r)
                                                                    for r, n in c.compressed)
        index = sum(n * (ctx // r) for r, n in c.indexed)
        return float(2 * 2 * cfg.num_attention_heads * cfg.head_dim * rows
                     + 2 * cfg.index_n_heads * cfg.index_head_dim * index)


@lru_cache(maxsize=4)
def flash_profile(cfg: V41Config) -> FlashProfile:
    """Count a config's per-layer weights from its checkpoint specs (Engram and DSpark excluded: Engram tables sit
    in host memory and DSpark is off in the planner's steps)."""
    n = cfg.num_hidden_layers
    acc = [[0, 0, 0, 0] for _ in range(n)]
    embed = head = head_params = 0
    for spec in checkpoint_tensor_specs(cfg):
        name = spec.name
        if name.startswith("mtp.") or ".engram." in name:
            continue
        nbytes = released_nbytes(spec)
        if name == "embed.weight":
            embed += nbytes
            continue
        if name in ("head.weight", "norm.weight"):
            head += nbytes
            head_params += spec.numel
            continue
        layer = layer_of(name)
        if layer is None or layer >= n:
            continue
        slot = 0 if _ROUTED.search(name) else 2
        acc[layer][slot] += nbytes
        acc[layer][slot + 1] += spec.numel
    layers = tuple(LayerWeights(*a) for a in acc)
    last = LayerPlan.from_config(cfg).last_kv_source
    return FlashProfile(cfg, layers, embed, head, head_params, last, attention_counts(cfg, range(last)),
                        attention_counts(cfg, range(n)), attention_counts(cfg, range(last, n)))
