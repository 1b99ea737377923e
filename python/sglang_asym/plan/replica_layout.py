"""Where a replica's weights sit on its GPUs: the one layout both the memory fit and the step-time model use.

A replica of G GPUs runs attention data-parallel and the routed experts expert-parallel (SGLang's DP attention + EP
for DeepSeek-style MoE). So every GPU (DP rank) holds its own copy of the dense weights (attention, shared expert,
router, mHC, norms, the head), the embeddings, the Engram projections and the DSpark drafter; the routed experts are
split over the G GPUs. A step reads the dense weights of the layers it runs and the routed experts its rows touch;
the embeddings (row gathers), the drafter (speculation is off in the planner's steps) and the Engram projections
(small next to the rest) are resident but not counted as read.

Per role, the resident weights come from footprint's tallies (checkpoint accounting): an asymmetric P holds the
embeddings, layers 0-19 and layer 20's KV path; every other role (D, symmetric P, colocated, and RFC #57738's P, whose
draft keeps the full model loaded) holds the whole backbone plus DSpark. Both hold the Engram projections (the tables
stay in host memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..checkpoint.accounting import BACKBONE_PARTS, PREFILL_BACKBONE_PARTS, Tally, part_tallies
from ..config import V41Config
from ..footprint import engram_bytes
from .errors import PlanInputError
from .flash_profile import flash_profile
from .steptime import Role


def resident_role(role: Role) -> Role:
    """Whose weights a replica of `role` keeps loaded: only the asymmetric P drops the decoder layers."""
    return Role.ASYM_P if role is Role.ASYM_P else Role.FULL


@lru_cache(maxsize=4)
def resident_weight_bytes(cfg: V41Config = V41Config()) -> dict[Role, int]:
    """Bytes of one copy of each resident set (footprint's definition, byte for byte)."""
    tallies = part_tallies(cfg)
    _, projections = engram_bytes(cfg)
    prefill = sum((tallies[p] for p in PREFILL_BACKBONE_PARTS), Tally()).bytes + projections
    full = sum((tallies[p] for p in BACKBONE_PARTS), Tally()).bytes + tallies["dspark"].bytes + projections
    return {Role.ASYM_P: prefill, Role.FULL: full}


@dataclass(frozen=True)
class ReplicaLayout:
    """The weights of one replica of `gpus` GPUs playing `role`, per GPU."""

    role: Role
    gpus: int
    cfg: V41Config = V41Config()

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise PlanInputError(f"a replica needs an int >= 1 GPUs, got {self.gpus!r}")

    @property
    def expert_bytes(self) -> int:
        """Routed experts of the resident layers (all GPUs together; split over them)."""
        return flash_profile(self.cfg).expert_bytes(resident_role(self.role))

    @property
    def replicated_bytes(self) -> int:
        """Everything but the routed experts: one copy on every GPU."""
        return resident_weight_bytes(self.cfg)[resident_role(self.role)] - self.expert_bytes

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.replicated_bytes + self.expert_bytes / self.gpus

    def step_read_bytes(self, run: Role, touched_share: float) -> float:
        """Weight bytes one GPU reads in a forward that runs `run`'s layers and touches `touched_share` of each
        layer's routed experts: its dense copy of those layers and its share of the touched experts."""
        if not 0 <= touched_share <= 1:
            raise PlanInputError(f"touched expert share must be in [0, 1], got {touched_share}")
        p = flash_profile(self.cfg)
        return p.dense_bytes(run) + touched_share * p.expert_bytes(run) / self.gpus

    def as_dict(self) -> dict:
        return {"role": self.role.value, "resident": resident_role(self.role).value, "gpus": self.gpus,
                "replicated_gb_per_gpu": round(self.replicated_bytes / 1e9, 3),
                "experts_gb_per_gpu": round(self.expert_bytes / self.gpus / 1e9, 3),
                "weight_gb_per_gpu": round(self.weight_bytes_per_gpu / 1e9, 3)}
