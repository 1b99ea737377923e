"""Capture-safe MoE: the same routed + shared experts as `moe.MoE`, with shapes that depend only on
the number of rows (no unique/where/.tolist over the routing), so a CUDA graph can hold it.

Two static paths, both row-wise (a row's output never depends on another row, so padding rows can
route anywhere without changing real rows):
  gather: each row multiplies its own top-k experts' weights, gathered per (row, slot); reads
          rows*k expert matrices, so it wins while rows * k <= n_experts (decode buckets);
  dense:  every expert runs over every row, scaled by a [rows, experts] combine matrix that is zero
          for experts a row did not pick; reads each expert once (window and mixed buckets).
Routed outputs are summed in ascending expert order in fp32, as the reference's index_add_ does.

The experts' weights are stacked once into [E, ...] tensors and each expert's parameters are made
views into them, so the stack costs no extra memory and later in-place weight loads stay visible.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from enum import Enum

import torch
from torch.nn import functional as F

from .moe import MoE


class MoEPath(str, Enum):
    GATHER = "gather"
    DENSE = "dense"


def moe_path_for_rows(rows: int, n_experts: int, top_k: int) -> MoEPath:
    """The static path a segment of `rows` rows uses (fixed per captured row count)."""
    return MoEPath.GATHER if rows * top_k <= n_experts else MoEPath.DENSE


@dataclass(frozen=True)
class StackedExperts:
    w1: torch.Tensor  # [E, inter, dim]
    w3: torch.Tensor  # [E, inter, dim]
    w2: torch.Tensor  # [E, dim, inter]

    def still_backs(self, moe: MoE) -> bool:
        """True while every expert's parameters are still views into this stack (a model moved to
        another device or given new parameter tensors would silently read stale weights otherwise)."""
        for name in ("w1", "w2", "w3"):
            stack = getattr(self, name)
            for e in (0, len(moe.experts) - 1):
                param = getattr(moe.experts[e], name).weight
                if param.data_ptr() != stack[e].data_ptr() or param.device != stack.device:
                    return False
        return True


_STACKED: "weakref.WeakKeyDictionary[MoE, StackedExperts]" = weakref.WeakKeyDictionary()


def stack_experts(moe: MoE) -> StackedExperts:
    """Stack the routed experts' weights and re-point each expert's parameters at its slice. Idempotent:
    a second runner over the same model shares the first one's stack."""
    known = _STACKED.get(moe)
    if known is not None and known.still_backs(moe):
        return known
    stacks = {}
    for name in ("w1", "w2", "w3"):
        params = [getattr(expert, name).weight for expert in moe.experts]
        stack = torch.stack([p.detach() for p in params])
        for e, param in enumerate(params):
            param.data = stack[e]
        stacks[name] = stack
    _STACKED[moe] = StackedExperts(**stacks)
    return _STACKED[moe]


def _shared(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    return moe.shared_experts.w2(moe.shared_experts.activation(x, moe.limit).to(x.dtype))


def _gather_routed(moe: MoE, experts: StackedExperts, x: torch.Tensor, weights: torch.Tensor,
                   indices: torch.Tensor) -> torch.Tensor:
    rows, top_k = indices.shape
    order = indices.argsort(dim=-1)  # ascending expert id per row: the reference's summation order
    indices, weights = indices.gather(1, order), weights.gather(1, order)
    flat = indices.reshape(-1)
    xr = x.unsqueeze(1).expand(-1, top_k, -1).reshape(rows * top_k, 1, -1)
    gate = torch.bmm(xr, experts.w1[flat].transpose(1, 2)).float().clamp(max=moe.limit)
    up = torch.bmm(xr, experts.w3[flat].transpose(1, 2)).float().clamp(min=-moe.limit, max=moe.limit)
    act = (F.silu(gate) * up * weights.reshape(-1, 1, 1)).to(x.dtype)
    out = torch.bmm(act, experts.w2[flat].transpose(1, 2)).view(rows, top_k, -1).float()
    return out.sum(dim=1)


def _dense_routed(moe: MoE, experts: StackedExperts, x: torch.Tensor, weights: torch.Tensor,
                  indices: torch.Tensor) -> torch.Tensor:
    combine = torch.zeros(x.shape[0], experts.w1.shape[0], dtype=torch.float32, device=x.device)
    combine.scatter_(1, indices, weights)  # top-k ids are distinct: no write collides
    xe = x.unsqueeze(0).expand(experts.w1.shape[0], -1, -1)
    gate = torch.bmm(xe, experts.w1.transpose(1, 2)).float().clamp(max=moe.limit)
    up = torch.bmm(xe, experts.w3.transpose(1, 2)).float().clamp(min=-moe.limit, max=moe.limit)
    act = (F.silu(gate) * up * combine.t().unsqueeze(-1)).to(x.dtype)
    return torch.bmm(act, experts.w2.transpose(1, 2)).float().sum(dim=0)


def static_moe(moe: MoE, experts: StackedExperts, x: torch.Tensor, path: MoEPath) -> torch.Tensor:
    """moe(x) for x [rows, dim] along a static path; equal to MoE.forward within float rounding."""
    weights, indices = moe.gate(x)
    if path is MoEPath.GATHER:
        routed = _gather_routed(moe, experts, x, weights, indices)
    else:
        routed = _dense_routed(moe, experts, x, weights, indices)
    return routed.to(x.dtype) + _shared(moe, x)
