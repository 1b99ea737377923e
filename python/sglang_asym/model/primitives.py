"""Small numeric building blocks: RMSNorm, adjacent-pair RoPE with YaRN, grouped linear.

Rounding boundaries follow the released inference code (normalise in fp32, complex-multiply
RoPE), so fp32 logits agree with NVIDIA's implementation to float tolerance."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..config import V41Config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x.float()
        v = v * torch.rsqrt(v.square().mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * v).to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T computed in x's dtype (fp32-kept weights are cast to the activation dtype)."""
    return F.linear(x, weight.to(x.dtype))


class RopeTable:
    """Rotation angles for one layer kind: plain (ratio-0 layers) or YaRN-scaled (compressed layers)."""

    def __init__(self, cfg: V41Config, compressed: bool) -> None:
        dim = cfg.qk_rope_head_dim
        theta = cfg.compress_rope_theta if compressed else cfg.rope_theta
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        scaling = cfg.rope_scaling_dict if compressed else {}
        original = int(scaling.get("original_max_position_embeddings", 0) or 0)
        if original > 0:
            factor = float(scaling.get("factor", 1.0))
            fast, slow = float(scaling.get("beta_fast", 32)), float(scaling.get("beta_slow", 1))

            def correction_dim(rotations: float) -> float:
                return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

            low = max(math.floor(correction_dim(fast)), 0)
            high = min(math.ceil(correction_dim(slow)), dim - 1)
            ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
            freqs = freqs / factor * ramp + freqs * (1 - ramp)
        self.freqs = freqs
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """[T] integer positions -> [T, dim/2] fp32 angles."""
        freqs = self._on_device.get(positions.device)
        if freqs is None:  # kept per device: a host-to-device copy could not run inside a CUDA graph capture
            freqs = self._on_device[positions.device] = self.freqs.to(positions.device)
        return positions.float().unsqueeze(-1) * freqs


def apply_rope(x: torch.Tensor, angles: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last 2*angles.shape[-1] channels of x ([T, C] or [T, H, C]) in adjacent pairs."""
    rot = angles.shape[-1] * 2
    pairs = torch.view_as_complex(x[..., -rot:].float().unflatten(-1, (-1, 2)).contiguous())
    turn = torch.polar(torch.ones_like(angles), angles)
    if x.ndim == 3:
        turn = turn.unsqueeze(1)
    if inverse:
        turn = turn.conj()
    rotated = torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)
    return torch.cat((x[..., :-rot], rotated), dim=-1)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, groups: int) -> torch.Tensor:
    """Block-diagonal projection: x [T, G, in] with weight [G*out, in] -> [T, G, out]."""
    w = weight.to(x.dtype).view(groups, -1, x.shape[-1])
    return torch.einsum("tgi,goi->tgo", x, w)
