"""Manifold hyper-connections (mHC): 4 residual streams mixed by per-token coefficients.

Single-pass handoff: a sublayer's input is the collapse of the streams with the `pre` mix that
the PREVIOUS site computed; its own site computes (pre, post, comb) from the streams it receives,
uses post/comb to write its output back, and hands `pre` to the next site."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.nn import functional as F


class Mix(NamedTuple):
    pre: torch.Tensor  # [T, S] fp32
    post: torch.Tensor  # [T, S] fp32
    comb: torch.Tensor  # [T, S_in, S_out] fp32


def sinkhorn(logits: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    x = logits.softmax(dim=-1) + eps
    x = x / (x.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iterations - 1):
        x = x / (x.sum(dim=-1, keepdim=True) + eps)
        x = x / (x.sum(dim=-2, keepdim=True) + eps)
    return x


def site_mix(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
             iterations: int, hc_eps: float, norm_eps: float) -> Mix:
    """streams [T, S, D] -> this site's coefficients (projection first, then the RMS factor)."""
    s = streams.shape[-2]
    flat = streams.flatten(-2).float()
    mixes = F.linear(flat, fn.float()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    scales = torch.cat((scale[0].expand(s), scale[1].expand(s), scale[2].expand(s * s)))
    logits = torch.addcmul(base, mixes, scales)
    pre = torch.sigmoid(logits[..., :s]) + hc_eps
    post = 2 * torch.sigmoid(logits[..., s : 2 * s])
    comb = sinkhorn(logits[..., 2 * s :].unflatten(-1, (s, s)), iterations, hc_eps)
    return Mix(pre, post, comb)


def collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    return (pre.unsqueeze(-1) * streams.float()).sum(-2).to(streams.dtype)


def expand(output: torch.Tensor, streams: torch.Tensor, mix: Mix) -> torch.Tensor:
    update = mix.post.unsqueeze(-1) * output.unsqueeze(-2)
    mixed = (mix.comb.unsqueeze(-1) * streams.unsqueeze(-2)).sum(-3)
    return (update + mixed).to(output.dtype)
