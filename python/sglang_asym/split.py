"""SplitPlan: where a request is cut between the prefill role and the decode role, and what crosses.

For a prompt of N tokens and window W: B = max(N - W, 0). The prefill role computes [0, B) and
ships, per KV owner, the compressed rows and index keys that [0, B) completes (ratio-2 owners:
floor(B/2) pair rows, plus the compressor tail when B is odd; the ratio-1 owner: B rows); with
the exact-encoder handoff also the encoder layers' window rows [B - (W-1), B). The decode role
computes [B, N) through every layer. N <= W: nothing crosses and the prefill role runs no layer.

Semantics (docs/v41-model.md, "Semantics"; docs/architecture.md follows a request through the split):
  exact               plain full prefill, no floors (cannot be split when N > W)
  decoder-replay      window queries from the last KV source on see window keys only from B
  asym                every layer's window keys floored at B on the decode role
  asym-exact-encoder  decoder-replay computed split: the prefill role also ships encoder window rows
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property

import torch

from .cache import ROW_FORMATS, GroupId, GroupKind
from .config import DEFAULT_WINDOW, V41Config
from .layer_plan import LayerPlan
from .manifest import PayloadManifest, RowGroup


class Semantics(str, Enum):
    EXACT = "exact"
    DECODER_REPLAY = "decoder-replay"
    ASYM = "asym"
    ASYM_EXACT_ENCODER = "asym-exact-encoder"

    @classmethod
    def parse(cls, value: "str | Semantics") -> "Semantics":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown semantics {value!r}; choose one of {[s.value for s in cls]}") from None


def _row_group(cfg: V41Config, gid: GroupId, num_rows: int, row_format: str, dtype: torch.dtype) -> RowGroup:
    return RowGroup(gid.name, gid.row_bytes(cfg, row_format, dtype), num_rows)


class SplitError(ValueError):
    """A split that cannot be made (bad window, prompt too long, semantics that cannot be split)."""


@dataclass(frozen=True)
class SplitPlan:
    config: V41Config
    prompt_len: int
    window: int = DEFAULT_WINDOW
    semantics: Semantics = Semantics.ASYM_EXACT_ENCODER

    def __post_init__(self) -> None:
        object.__setattr__(self, "semantics", Semantics.parse(self.semantics))
        if type(self.window) is not int or self.window < 1:
            raise SplitError(f"window W must be a positive integer, got {self.window!r}")
        if self.window > self.config.sliding_window:
            raise SplitError(f"window W={self.window} exceeds the model's sliding window {self.config.sliding_window}")
        if type(self.prompt_len) is not int or self.prompt_len < 1:
            raise SplitError(f"prompt length must be a positive integer, got {self.prompt_len!r}")
        if self.prompt_len > self.config.max_position_embeddings:
            raise SplitError(f"prompt of {self.prompt_len} tokens exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings}")

    # ---- the cut ---------------------------------------------------------------------------
    @property
    def boundary(self) -> int:
        """B = N - W: the first token the decode role computes (0 when N <= W)."""
        return max(self.prompt_len - self.window, 0)

    @property
    def runs_prefill(self) -> bool:
        return self.boundary > 0

    def require_splittable(self) -> None:
        if self.semantics is Semantics.EXACT and self.boundary > 0:
            raise SplitError("semantics 'exact' cannot be split when N > W: the decode role never has the "
                             "decoder layers' window rows below B; use decoder-replay / asym-exact-encoder")

    @cached_property
    def plan(self) -> LayerPlan:  # built once per split: it lists every tensor name (tens of ms on small)
        return LayerPlan.from_config(self.config)

    @property
    def ships_encoder_swa(self) -> bool:
        return self.runs_prefill and self.semantics in (Semantics.ASYM_EXACT_ENCODER, Semantics.DECODER_REPLAY)

    @property
    def encoder_swa_rows(self) -> tuple[int, int]:
        """Window rows [start, B) the exact-encoder handoff ships per encoder layer."""
        b = self.boundary
        return (max(b - (self.config.sliding_window - 1), 0), b) if self.ships_encoder_swa else (b, b)

    def compressed_rows(self, owner: int) -> int:
        return self.boundary // self.config.compress_ratios[owner]

    def has_tail(self, owner: int) -> bool:
        ratio = self.config.compress_ratios[owner]
        return ratio > 1 and self.boundary % ratio != 0

    def swa_floors(self) -> dict[int, int]:
        """Per-layer window floors the decode role's window step applies (absolute positions)."""
        b, last = self.boundary, self.plan.last_kv_source
        layers = range(self.config.num_hidden_layers)
        if b == 0 or self.semantics is Semantics.EXACT:
            return {}
        if self.semantics is Semantics.ASYM:
            return {i: b for i in layers}
        return {i: b for i in layers if i >= last}

    # ---- the payload -----------------------------------------------------------------------
    def manifest(self, row_format: str = "release", dtype: torch.dtype = torch.float32) -> PayloadManifest:
        """Row groups and bytes of the prefix payload, in the model dtype or at the release's formats."""
        if row_format not in ROW_FORMATS:
            raise ValueError(f"row format must be one of {ROW_FORMATS}, got {row_format!r}")
        if not self.runs_prefill:
            return PayloadManifest(())

        def group(kind: GroupKind, layer: int, num_rows: int) -> RowGroup:
            return _row_group(self.config, GroupId(kind, layer), num_rows, row_format, dtype)

        groups = []
        for owner in self.plan.kv_owner_layers:
            groups += [group(GroupKind.KV, owner, self.compressed_rows(owner)),
                       group(GroupKind.INDEX, owner, self.compressed_rows(owner))]
            if self.has_tail(owner):
                groups.append(group(GroupKind.TAIL, owner, 1))
        start, end = self.encoder_swa_rows
        if end > start:
            groups += [group(GroupKind.SWA, i, end - start) for i in self.plan.encoder_layers]
        return PayloadManifest(tuple(groups))

    def symmetric_manifest(self, dspark_ring_bytes: int = 0) -> PayloadManifest:
        """What symmetric PD ships for the same prompt at the release's formats: global rows for all
        N tokens, every layer's window rows, and the drafter's rings (for comparison only)."""
        cfg, n = self.config, self.prompt_len

        def group(kind: GroupKind, layer: int, num_rows: int) -> RowGroup:
            return _row_group(cfg, GroupId(kind, layer), num_rows, "release", torch.float32)

        groups = []
        for owner in self.plan.kv_owner_layers:
            ratio = cfg.compress_ratios[owner]
            groups += [group(GroupKind.KV, owner, n // ratio), group(GroupKind.INDEX, owner, n // ratio)]
            if ratio > 1 and n % ratio:
                groups.append(group(GroupKind.TAIL, owner, 1))
        groups += [group(GroupKind.SWA, i, min(n, cfg.sliding_window)) for i in range(cfg.num_hidden_layers)]
        if dspark_ring_bytes:
            groups.append(RowGroup("dspark.rings", dspark_ring_bytes, 1))
        return PayloadManifest(tuple(groups))
