"""V41Model: the reference DeepSeek-V4.1 backbone with per-request caches.

One entry point, `forward(tokens, cache)`, runs a chunk of consecutive tokens on top of whatever the
cache already holds; full prefill, chunked prefill, the window step and decode/verify steps are
all this call (see `sglang_asym.model.steps`). `role='prefill'` builds the partial model of the
asymmetric prefill worker: embeddings, encoder layers and the last KV source's KV/indexer path;
its forward returns nothing and leaves compressed rows, index keys and tails in the cache."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from ..cache import CacheSet, CacheSizing, RequestCache
from ..config import ConfigError, V41Config
from ..layer_plan import LayerPlan
from .attention import ChunkState
from .block import Block, KVPathBlock
from .mhc import collapse
from .primitives import RMSNorm
from .quant import Quantizer

ModelRole = Literal["full", "prefill"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class InvalidInput(ValueError):
    """A request the model cannot run (empty, out-of-vocabulary ids, too long)."""


def resolve_dtype(dtype: torch.dtype | str | None, cfg: V41Config) -> torch.dtype:
    if dtype is None:
        dtype = cfg.dtype
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
        dtype = _DTYPES[dtype]
    return dtype


class V41Model(nn.Module):
    def __init__(self, cfg: V41Config, role: ModelRole = "full", dtype: torch.dtype | str | None = None,
                 cache_quant: str = "none", device: torch.device | str = "cpu") -> None:
        super().__init__()
        if role not in ("full", "prefill"):
            raise ValueError(f"model role must be 'full' or 'prefill', got {role!r}")
        if any(layer < cfg.num_hidden_layers for layer in cfg.engram_layer_ids):
            raise ConfigError("the reference model leaves Engram out (see README): engram_layer_ids must be empty")
        self.cfg, self.role = cfg, role
        self.dtype = resolve_dtype(dtype, cfg)
        self.quant = Quantizer(cache_quant)
        self.plan = LayerPlan.from_config(cfg)
        last = self.plan.last_kv_source
        with torch.device(device):
            self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=self.dtype)
            self.embed.weight.requires_grad_(False)
            if role == "full":
                self.layers = nn.ModuleList(Block(cfg, info, self.dtype) for info in self.plan.layers)
                self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, self.dtype)
                self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=torch.float32)
                self.head.weight.requires_grad_(False)
            else:
                blocks: list[nn.Module] = [Block(cfg, info, self.dtype) for info in self.plan.layers[:last]]
                blocks.append(KVPathBlock(cfg, self.plan.layers[last], self.dtype))
                self.layers = nn.ModuleList(blocks)
        self.requires_grad_(False)
        self.layers_run: tuple[int, ...] = ()
        self.captured: dict[int, torch.Tensor] = {}

    # ---- weights ---------------------------------------------------------------------------
    def expected_tensor_names(self) -> frozenset[str]:
        return frozenset(self.plan.all_tensor_names) if self.role == "full" else self.plan.prefill_tensor_names

    def load_weights(self, weights: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Copy released-name tensors into the model; with `strict` every expected tensor must be present
        (a caller loading in parts passes strict=False and checks completeness itself)."""
        own = self.state_dict()
        missing = sorted(self.expected_tensor_names() - weights.keys())
        if missing and strict:
            raise KeyError(f"checkpoint is missing {len(missing)} tensor(s) this {self.role} model needs, "
                           f"e.g. {missing[:5]}")
        for name, value in weights.items():
            if name not in own:
                continue
            if tuple(value.shape) != tuple(own[name].shape):
                raise ValueError(f"tensor {name}: shape {tuple(value.shape)} != expected {tuple(own[name].shape)}")
            own[name].copy_(value.to(own[name].dtype))

    def new_cache_set(self, sizing: CacheSizing = CacheSizing()) -> CacheSet:
        return CacheSet(self.cfg, self.dtype, sizing, role=self.role, device=self.embed.weight.device)

    # ---- forward ---------------------------------------------------------------------------
    def validate_tokens(self, tokens: torch.Tensor, start: int) -> None:
        if tokens.ndim != 1 or tokens.dtype not in (torch.int64, torch.int32):
            raise InvalidInput(f"tokens must be a 1-D integer tensor, got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.numel() == 0:
            raise InvalidInput("empty prompt: at least one token is required")
        bad = (tokens < 0) | (tokens >= self.cfg.vocab_size)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise InvalidInput(f"token id {int(tokens[i])} at index {i} is outside the vocabulary [0, {self.cfg.vocab_size})")
        if start + tokens.numel() > self.cfg.max_position_embeddings:
            raise InvalidInput(f"sequence of {start + tokens.numel()} tokens exceeds max_position_embeddings "
                               f"{self.cfg.max_position_embeddings}")

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: RequestCache, logits: str = "last",
                capture: tuple[int, ...] = ()) -> torch.Tensor | None:
        """Run tokens at positions [cache.pos, cache.pos + T). logits: 'last' -> [V], 'all' -> [T, V],
        'none' -> None (the prefill role always returns None). `capture`: layer ids whose input
        streams, averaged over the streams ([T, hidden]), are left in `self.captured` (drafter features)."""
        if cache.released:
            raise RuntimeError("cache was released")
        if cache.set.role != self.role:
            raise ValueError(f"a {cache.set.role}-role cache cannot serve a {self.role}-role model")
        if logits not in ("last", "all", "none"):
            raise ValueError(f"logits must be 'last', 'all' or 'none', got {logits!r}")
        start = cache.pos
        self.validate_tokens(tokens, start)
        tokens = tokens.to(self.embed.weight.device).long()
        state = ChunkState(positions=torch.arange(start, start + tokens.numel(), device=tokens.device))
        streams = self.embed(tokens).unsqueeze(1).expand(-1, self.cfg.hc_mult, -1)
        pre = torch.zeros(tokens.numel(), self.cfg.hc_mult, dtype=torch.float32, device=tokens.device)
        pre[:, 0] = 1
        ran = []
        self.captured = {}
        for block in self.layers:
            ran.append(block.info.index)
            if block.info.index in capture:
                self.captured[block.info.index] = streams.float().mean(dim=1).to(streams.dtype)
            if isinstance(block, KVPathBlock):
                block(streams, pre, state, cache, self.quant)
                break
            streams, pre = block(streams, pre, state, cache, self.quant)
        self.layers_run = tuple(ran)  # layer ids the last forward executed (KV path counts as its layer)
        cache.pos = start + tokens.numel()
        if self.role == "prefill" or logits == "none":
            return None
        hidden = collapse(streams if logits == "all" else streams[-1:], pre if logits == "all" else pre[-1:])
        out = nn.functional.linear(self.norm(hidden).float(), self.head.weight)
        return out if logits == "all" else out[0]
