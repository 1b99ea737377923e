"""SGLang's decoder SWA bounded replay on the CPU route, and the switch back to full compute.

SGLang 0.5.23 runs bounded replay by default on CUDA, in null mode and in both PD roles: a prompt's rows before
B = N - W run only the layers before the last KV source and that layer's compressed rows and index keys; the
rows from B on run every layer (their windows from the last KV source on start at B, the decoder-replay
floors, so no row reads what the skipped layers would have written). The CPU route's layers do the same
for a full model's prompt rows (`ReplayMode.bounded`). `SGLANG_ASYM_FULL_COMPUTE=1` turns it off, so every
prompt row runs every layer: the old full-compute symmetric baseline, which benchmarks label as such.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

FULL_COMPUTE_ENV = "SGLANG_ASYM_FULL_COMPUTE"


@dataclass(frozen=True)
class ReplayMode:
    """Whether a full model's prompt rows before B stop at the last KV source (SGLang's default)."""

    bounded: bool = True

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> "ReplayMode":
        value = environ.get(FULL_COMPUTE_ENV, "")
        if value not in ("", "0", "1"):
            raise ValueError(f"{FULL_COMPUTE_ENV} must be 1 (full compute) or 0 / unset (bounded replay), got {value!r}")
        return cls(bounded=value != "1")

    @property
    def label(self) -> str:
        return "bounded-replay" if self.bounded else "full-compute"

    def to_kv_source_only(self, end: int, boundary: int, floors: Mapping[int, int], late_layers: range) -> bool:
        """Whether prompt rows ending at `end` run only up to the last KV source: they lie before B and every
        layer from that source on starts its window at B or later (`floors`), so no later row reads them there.
        Their logits are never sampled: the prompt's last row lies at N - 1 >= B."""
        return self.bounded and 0 < end <= boundary and all(floors.get(layer, 0) >= boundary for layer in late_layers)
