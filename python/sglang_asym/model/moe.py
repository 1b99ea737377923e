"""Mixture of experts: sqrt(softplus) router with bias-corrected top-k, one shared expert,
clamped SwiGLU experts (gate clamped above, up clamped both ways, computed in fp32)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..config import V41Config


class Expert(nn.Module):
    def __init__(self, dim: int, inter: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, inter, bias=False, dtype=dtype)
        self.w2 = nn.Linear(inter, dim, bias=False, dtype=dtype)
        self.w3 = nn.Linear(dim, inter, bias=False, dtype=dtype)

    def activation(self, x: torch.Tensor, limit: float) -> torch.Tensor:
        gate = self.w1(x).float().clamp(max=limit)
        up = self.w3(x).float().clamp(min=-limit, max=limit)
        return F.silu(gate) * up


class Gate(nn.Module):
    def __init__(self, cfg: V41Config, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cfg.n_routed_experts, cfg.hidden_size, dtype=dtype), requires_grad=False)
        # `bias` is the routing correction bias (noaux_tc); `bias_vl` routes vision tokens (unused for text).
        self.register_buffer("bias", torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        self.register_buffer("bias_vl", torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        self.topk = cfg.num_experts_per_tok
        self.normalize = cfg.norm_topk_prob
        self.route_scale = cfg.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.sqrt(F.softplus(F.linear(x.float(), self.weight.float())))
        indices = (scores + self.bias).topk(self.topk, dim=-1)[1]
        weights = scores.gather(1, indices)
        if self.normalize and self.topk > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.route_scale, indices


class MoE(nn.Module):
    def __init__(self, cfg: V41Config, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate = Gate(cfg, dtype)
        self.experts = nn.ModuleList(Expert(cfg.hidden_size, cfg.moe_intermediate_size, dtype)
                                     for _ in range(cfg.n_routed_experts))
        self.shared_experts = Expert(cfg.hidden_size, cfg.moe_intermediate_size, dtype)
        self.limit = cfg.swiglu_limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, indices = self.gate(x)
        # (token, slot) pairs grouped by expert, tokens ascending inside a group: each expert runs once
        # over its rows (of every request in a batch), and every token's contributions are summed in
        # ascending expert order.
        flat = indices.flatten()
        order = torch.argsort(flat, stable=True)
        token = order // indices.shape[1]
        rows, pair_weights = x[token], weights.flatten()[order].unsqueeze(-1)
        groups = [(self.experts[e], count) for e, count in
                  enumerate(torch.bincount(flat, minlength=len(self.experts)).tolist()) if count]
        # Per expert only its matmuls; the element-wise activation runs once over all pairs (row-wise, so
        # each row's value is what Expert.activation gives it).
        gates, ups, start = [], [], 0
        for expert, count in groups:
            part = rows[start : start + count]
            gates.append(F.linear(part, expert.w1.weight))
            ups.append(F.linear(part, expert.w3.weight))
            start += count
        gate = torch.cat(gates).float().clamp(max=self.limit)
        up = torch.cat(ups).float().clamp(min=-self.limit, max=self.limit)
        act = (F.silu(gate) * up * pair_weights).to(x.dtype)
        outs, start = [], 0
        for expert, count in groups:
            outs.append(F.linear(act[start : start + count], expert.w2.weight))
            start += count
        routed = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        routed.index_add_(0, token, torch.cat(outs).float())
        shared = self.shared_experts.w2(self.shared_experts.activation(x, self.limit).to(x.dtype))
        return routed.to(x.dtype) + shared
