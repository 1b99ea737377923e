"""Serving-unit layout: P and D replicas packed into scale-up domains, and the operator's dry-run refusal.

A serving unit is B prefill replicas of A GPUs and D decode replicas of C GPUs that transfer KV among
themselves. Under `same-domain` placement the whole unit must sit in one NVLink domain (KV moves over
NVLink); under `any` only each replica must (its EP all-to-all needs NVLink) and KV may cross the
scale-out network. A refusal reads like an operator's dry run:
  error  stage prod-us: fleet h200-use1 domain is 8 GPUs; serving unit needs 72 (same-domain)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .errors import PlanInputError


class Placement(str, Enum):
    SAME_DOMAIN = "same-domain"
    ANY = "any"


class LayoutError(PlanInputError):
    """A serving unit the fleet cannot place; str() is the dry run's one-line error."""


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PlanInputError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class ServingUnit:
    """B prefill replicas of A GPUs + D decode replicas of C GPUs (colocated: B = 0, its replicas are 'decode')."""

    prefill_gpus: int  # A
    prefill_replicas: int  # B
    decode_gpus: int  # C
    decode_replicas: int  # D

    def __post_init__(self) -> None:
        _count("prefill GPUs per replica", self.prefill_gpus, 0)
        _count("prefill replicas", self.prefill_replicas, 0)
        _count("decode GPUs per replica", self.decode_gpus, 1)
        _count("decode replicas", self.decode_replicas, 1)
        if self.prefill_replicas and not self.prefill_gpus:
            raise PlanInputError("prefill replicas need >= 1 GPU each")

    @property
    def total_gpus(self) -> int:
        return self.prefill_gpus * self.prefill_replicas + self.decode_gpus * self.decode_replicas

    @property
    def prefill_total(self) -> int:
        return self.prefill_gpus * self.prefill_replicas


@dataclass(frozen=True)
class DryRun:
    """A placed unit: how many fit in one domain and what is left over."""

    unit: ServingUnit
    domain_gpus: int
    placement: Placement
    stage: str
    fleet: str

    def as_dict(self) -> dict:
        u = self.unit
        per_domain = self.domain_gpus // u.total_gpus if u.total_gpus <= self.domain_gpus else 0
        return {
            "stage": self.stage, "fleet": self.fleet, "placement": self.placement.value,
            "domain_gpus": self.domain_gpus,
            "serving_unit": {"prefill": f"{u.prefill_replicas} x {u.prefill_gpus} GPUs",
                             "decode": f"{u.decode_replicas} x {u.decode_gpus} GPUs", "gpus": u.total_gpus,
                             "prefill_share": u.prefill_total / u.total_gpus},
            "units_per_domain": per_domain,
            "idle_gpus_per_domain": self.domain_gpus - per_domain * u.total_gpus if per_domain else None,
            "domains_per_unit": -(-u.total_gpus // self.domain_gpus),
            "kv_link": "nvlink" if self.placement is Placement.SAME_DOMAIN or u.total_gpus <= self.domain_gpus
            else "scale-out (rdma)",
        }


def dry_run(unit: ServingUnit, domain_gpus: int, placement: Placement | str = Placement.SAME_DOMAIN,
            stage: str = "plan", fleet: str = "fleet") -> DryRun:
    """Place `unit` in domains of `domain_gpus` GPUs; LayoutError when it cannot be placed."""
    _count("domain GPUs", domain_gpus, 1)
    try:
        placement = Placement(placement)
    except ValueError:
        raise PlanInputError(f"placement must be one of {[p.value for p in Placement]}, got {placement!r}") from None
    where = f"stage {stage}: fleet {fleet} domain is {domain_gpus} GPUs"
    if placement is Placement.SAME_DOMAIN and unit.total_gpus > domain_gpus:
        raise LayoutError(f"{where}; serving unit needs {unit.total_gpus} (same-domain)")
    for role, gpus in (("prefill", unit.prefill_gpus), ("decode", unit.decode_gpus)):
        if gpus > domain_gpus:
            raise LayoutError(f"{where}; a {role} replica needs {gpus} (its expert-parallel group must share "
                              "one domain)")
    return DryRun(unit, domain_gpus, placement, stage, fleet)
