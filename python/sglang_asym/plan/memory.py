"""Memory fit of P and D replicas of V4.1-Flash on a GPU type, from the project's footprint accounting.

Weights per GPU come from ReplicaLayout (the step-time model's layout too): an asymmetric P holds the embeddings,
layers 0-19 and layer 20's KV path; every other replica (D, symmetric P, colocated, RFC #57738's P) the whole
backbone plus DSpark; dense weights are copied on every GPU (DP attention), routed experts split over the GPUs.
Every GPU keeps `reserve_bytes_per_gpu` for activations, workspaces and graphs. What is left holds KV: per request,
its compressed global rows (footprint.global_kv_bytes_per_token per token) plus every window layer's 128 rows and
the compressor tails.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import V41Config
from ..footprint import FitAssumptions, compressor_tail_bytes, global_kv_bytes_per_token, swa_row_bytes
from .errors import PlanInputError
from .gpus import GpuSpec
from .replica_layout import ReplicaLayout
from .steptime import Role
from .transfer_model import layer_plan_of

REPLICA_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # divisors of the 384 routed experts (even EP)


def request_kv_bytes(role: Role, context_tokens: int, cfg: V41Config = V41Config()) -> float:
    """Cache bytes one request holds at `context_tokens`: global rows, window rows of every window layer, tails."""
    if context_tokens < 0:
        raise PlanInputError(f"context must be >= 0 tokens, got {context_tokens}")
    full = role in (Role.FULL, Role.SYM_P)  # the roles that run every layer keep every layer's window rows
    swa_layers = (cfg.num_hidden_layers + cfg.num_nextn_predict_layers) if full else cfg.last_kv_source
    ratio2_owners = len(layer_plan_of(cfg).ratio2_owners)  # P and D both hold the ratio-2 owners' tails
    return (global_kv_bytes_per_token(cfg) * context_tokens
            + swa_layers * swa_row_bytes(cfg) * min(context_tokens, cfg.sliding_window)
            + ratio2_owners * compressor_tail_bytes(cfg))


@dataclass(frozen=True)
class ReplicaFit:
    """One replica of `gpus` GPUs of a role: weights per GPU, bytes left for KV, and what that holds."""

    role: Role
    gpu: str
    gpus: int
    weight_bytes_per_gpu: float
    kv_bytes: float  # left for KV in the whole replica
    fits: bool  # weights + reserve fit and some KV is left
    max_requests_at_context: int  # requests of `context` tokens the KV space holds
    context: int

    def as_dict(self) -> dict:
        return {"role": self.role.value, "gpu": self.gpu, "gpus": self.gpus,
                "weight_gb_per_gpu": round(self.weight_bytes_per_gpu / 1e9, 2), "kv_gb": round(self.kv_bytes / 1e9, 2),
                "fits": self.fits, "max_requests_at_context": self.max_requests_at_context, "context": self.context}


def replica_fit(role: Role, gpu: GpuSpec, gpus: int, context: int,
                assumptions: FitAssumptions = FitAssumptions(), cfg: V41Config = V41Config()) -> ReplicaFit:
    layout = ReplicaLayout(role, gpus, cfg)
    free = (gpu.hbm_bytes - layout.weight_bytes_per_gpu - assumptions.reserve_bytes_per_gpu) * gpus
    per_request = request_kv_bytes(role, context, cfg)
    fits = free > 0
    return ReplicaFit(role, gpu.name, gpus, layout.weight_bytes_per_gpu, max(free, 0.0), fits,
                      int(max(free, 0.0) // per_request) if fits else 0, context)


def min_replica_gpus(role: Role, gpu: GpuSpec, context: int, min_requests: int = 1,
                     assumptions: FitAssumptions = FitAssumptions(), cfg: V41Config = V41Config()) -> ReplicaFit:
    """The smallest replica (in REPLICA_SIZES, within the GPU's domain) whose KV space holds `min_requests`
    requests of `context` tokens; PlanInputError if none does."""
    for n in REPLICA_SIZES:
        if n > gpu.domain_gpus:
            break
        fit = replica_fit(role, gpu, n, context, assumptions, cfg)
        if fit.fits and fit.max_requests_at_context >= min_requests:
            return fit
    raise PlanInputError(f"no {role.value} replica of up to {gpu.domain_gpus} {gpu.name} GPUs holds {min_requests} "
                         f"requests of {context} tokens")
