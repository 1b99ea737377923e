"""Running copy plans: the Triton kernel on CUDA, the torch reference on CPU, or either by name.

    plan = gather_plan(sites, extent)        # once per request (plan.py)
    run_plan(plan)                           # "auto": Triton on CUDA, the torch reference on CPU
    run_plan(plan, "triton")                 # on CPU: Triton's interpreter (slow; tests)
"""

from __future__ import annotations

from typing import Sequence

import torch

from .plan import CopyPlan, gather_plan, scatter_plan
from .reference import run_reference
from .sites import RowSites

BACKENDS = ("auto", "torch", "triton")
RUNS = {"torch": 0, "triton": 0}   # plans run per backend in this process (lets tests see the path taken)


def resolve_backend(backend: str, device: torch.device) -> str:
    """"torch" or "triton" for a plan on `device` ("auto": Triton on CUDA, torch elsewhere)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown copy backend {backend!r}; choose one of {BACKENDS}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return backend


def run_plan(plan: CopyPlan, backend: str = "auto") -> None:
    chosen = resolve_backend(backend, plan.device)
    if chosen == "torch":
        run_reference(plan)
    else:
        from .triton_copy import run_triton  # Triton is only needed here
        run_triton(plan)
    RUNS[chosen] += 1


def gather(sites: Sequence[RowSites], extent: torch.Tensor, offset: int = 0, backend: str = "auto") -> CopyPlan:
    """Copy the groups' rows into `extent` from `offset` in wire order; returns the plan (reusable)."""
    plan = gather_plan(sites, extent, offset)
    run_plan(plan, backend)
    return plan


def scatter(extent: torch.Tensor, sites: Sequence[RowSites], offset: int = 0, backend: str = "auto") -> CopyPlan:
    """Copy a payload laid out in wire order at `offset` of `extent` into the groups' row sites."""
    plan = scatter_plan(extent, sites, offset)
    run_plan(plan, backend)
    return plan
