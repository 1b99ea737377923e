"""Next-token training of V41Model on a token stream: AdamW, warm-up then cosine decay, clipped grads.

The forward is the reference model's own batched pass (`V41Model.run_batch`) with autograd on, each
sequence on a fresh request cache, cache quantization off. The indexers' top-k selection passes no
gradient, so their weights keep their initial values. Deterministic for a seed on one thread: batches
come from a seeded generator and nothing else draws random numbers."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from tqdm import tqdm

from ..model.model import SegmentInput, V41Model


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    batch: int = 8
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_fraction: float = 0.1
    warmup: int = 20
    weight_decay: float = 0.01
    clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not (self.lr > 0 and 0 <= self.min_lr_fraction <= 1 and self.warmup >= 0 and self.clip > 0):
            raise ValueError("lr and clip must be positive, min_lr_fraction in [0, 1], warmup >= 0")

    def lr_at(self, step: int) -> float:
        """Linear warm-up over `warmup` steps, then cosine down to min_lr_fraction * lr at the last step."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        span = max(self.steps - self.warmup - 1, 1)
        progress = min((step - self.warmup) / span, 1.0)
        low = self.min_lr_fraction
        return self.lr * (low + (1 - low) * 0.5 * (1 + math.cos(math.pi * progress)))


def sample_batch(stream: torch.Tensor, cfg: TrainConfig, generator: torch.Generator) -> torch.Tensor:
    """[batch, seq_len + 1] random crops of the stream (inputs are [:, :-1], targets [:, 1:])."""
    if stream.numel() < cfg.seq_len + 2:
        raise ValueError(f"stream of {stream.numel()} tokens is shorter than seq_len + 2 = {cfg.seq_len + 2}")
    starts = torch.randint(0, stream.numel() - cfg.seq_len - 1, (cfg.batch,), generator=generator)
    return torch.stack([stream[s : s + cfg.seq_len + 1] for s in starts.tolist()])


def sequence_logits(model: V41Model, inputs: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits of B sequences, each from position 0 on its own cache (autograd as the caller set)."""
    cache_set = model.new_cache_set()
    caches = [cache_set.new_request() for _ in range(inputs.shape[0])]
    try:
        outs = model.run_batch([SegmentInput(row, cache, "all") for row, cache in zip(inputs, caches)])
    finally:
        for cache in caches:
            cache.release()
    return torch.stack([o.logits for o in outs])


def trainable(model: V41Model) -> list[tuple[str, torch.nn.Parameter]]:
    """Every floating-point parameter, switched to requires_grad (buffers such as router biases stay)."""
    params = [(name, p) for name, p in model.named_parameters() if p.is_floating_point()]
    for _, p in params:
        p.requires_grad_(True)
    return params


def train(model: V41Model, stream: torch.Tensor, cfg: TrainConfig, progress: bool = True) -> list[float]:
    """Train in place; returns the loss of every step (mean nats per predicted token)."""
    params = trainable(model)
    decay = [p for name, p in params if p.ndim >= 2 and not name.endswith("_fn")]
    no_decay = [p for name, p in params if not (p.ndim >= 2 and not name.endswith("_fn"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=cfg.lr, betas=(0.9, 0.95), foreach=False)
    generator = torch.Generator().manual_seed(cfg.seed)
    losses: list[float] = []
    bar = tqdm(range(cfg.steps), desc="training", unit="step", file=sys.stderr, disable=not progress)
    try:
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr_at(step)
            rows = sample_batch(stream, cfg, generator)
            with torch.enable_grad():
                logits = sequence_logits(model, rows[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in params], cfg.clip)
            optimizer.step()
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{cfg.lr_at(step):.1e}")
    finally:
        model.requires_grad_(False)
    return losses
