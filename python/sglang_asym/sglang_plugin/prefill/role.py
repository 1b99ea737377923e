"""The prefill role's share of a released V4.1 checkpoint, in checkpoint names and in SGLang's.

`PrefillRole.from_config` derives everything from the core's LayerPlan (no second copy of the rule):
- `checkpoint_names`: `LayerPlan.prefill_tensor_names` plus the `.scale` stored beside each of
  those weights at the released precision, plus the Engram tensors of encoder layers. LayerPlan
  leaves Engram out because the core's reference model has none; SGLang's V4.1 model runs Engram
  inside layers 1 and 14 (Flash), which are encoder layers, so the prefill role needs them too.
- `kv_path_params`: the parameters (SGLang names, relative to the layer) that the last KV source
  keeps: its input norm, compressor and index-key projection. Everything else of that layer
  (attention projections, sink, MoE, mHC mixers, FFN norm) is decode-only.
This module imports nothing from SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...checkpoint.specs import disk_layout, engram_tensor_specs
from ...config import V41Config
from ...layer_plan import LayerPlan
from ...tensor_specs import backbone_tensor_specs, layer_of
from ..shared.weight_names import sglang_name

RELEASED_PRECISION = "release"


@dataclass(frozen=True)
class PrefillRole:
    """What an asym-prefill server builds and loads of the V4.1 model."""

    num_layers: int
    last_kv_source: int  # the layer whose KV path is the role's last computation
    checkpoint_names: frozenset[str]  # released tensor names (weights and scales) the role loads
    kv_path_params: frozenset[str]  # SGLang parameter names of the last KV source, without the layer prefix

    @classmethod
    def from_config(cls, cfg: V41Config) -> "PrefillRole":
        plan = LayerPlan.from_config(cfg)
        last = plan.last_kv_source
        specs = backbone_tensor_specs(cfg) + [
            s for s in engram_tensor_specs(cfg) if layer_of(s.name) is not None and layer_of(s.name) < last
        ]
        wanted = set(plan.prefill_tensor_names) | {s.name for s in specs if s.name.startswith("layers.")
                                                   and ".engram." in s.name}
        names = {stored.name for s in specs if s.name in wanted for stored in disk_layout(s, RELEASED_PRECISION)}
        prefix = f"model.layers.{last}."
        kv_path = frozenset(
            sglang_name(n).removeprefix(prefix) for n in plan.prefill_tensor_names if layer_of(n) == last
        )
        return cls(cfg.num_hidden_layers, last, frozenset(names), kv_path)

    @property
    def encoder_layers(self) -> range:
        return range(self.last_kv_source)

    def admits(self, checkpoint_name: str) -> bool:
        return checkpoint_name in self.checkpoint_names
