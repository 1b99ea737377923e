"""V41Model: the reference DeepSeek-V4.1 backbone with per-request caches.

One entry point, `forward(tokens, cache)`, runs a chunk of consecutive tokens on top of whatever the
cache already holds; full prefill, chunked prefill, the window step and decode/verify steps are
all this call (see `sglang_asym.model.steps`). `forward_batch` runs several requests' chunks in one
pass (the decode worker's steps); `forward` is a batch of one. `role='prefill'` builds the partial
model of the asymmetric prefill worker: embeddings, encoder layers and the last KV source's
KV/indexer path; its forward returns nothing and leaves compressed rows, index keys and tails in
the cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch
from torch import nn

from ..cache import CacheSet, RequestCache, kv_group, swa_group
from ..config import ConfigError, V41Config
from ..layer_plan import LayerPlan
from .batch import ChunkState, RowBatch, Segment
from .block import Block, KVPathBlock
from .mhc import collapse
from .primitives import RMSNorm
from .quant import Quantizer

ModelRole = Literal["full", "prefill"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class SegmentInput:
    """One request's chunk in a batched forward: tokens at [cache.pos, cache.pos + T) and what to return."""

    tokens: torch.Tensor
    cache: RequestCache
    logits: str = "last"  # 'last' -> [V], 'all' -> [T, V], 'none' -> None
    capture: tuple[int, ...] = ()  # layers whose stream-averaged inputs [T, hidden] come back in `captured`


@dataclass(frozen=True)
class SegmentOutput:
    logits: torch.Tensor | None
    captured: dict[int, torch.Tensor] = field(default_factory=dict)


class InvalidSegment(Exception):
    """forward_batch input `index` cannot run (`error` says why); raised before any cache is changed."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(f"batch input {index}: {error}")
        self.index, self.error = index, error


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
        self.quant = Quantizer(cache_quant, rope_channels=cfg.qk_rope_head_dim)
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
        # Batch-invariant mode (`--enable-deterministic-inference`): see run_batch. Off by default.
        self.deterministic = False
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

    def new_cache_set(self) -> CacheSet:
        return CacheSet(self.cfg, self.plan, self.dtype, role=self.role, device=self.embed.weight.device)

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
        try:
            out = self.forward_batch([SegmentInput(tokens, cache, logits, capture)])[0]
        except InvalidSegment as exc:
            raise exc.error from None
        self.captured = out.captured
        return out.logits

    @torch.no_grad()
    def forward_batch(self, inputs: Sequence[SegmentInput]) -> list[SegmentOutput]:
        """Several requests' chunks in one pass: embedding, projections, mHC, MoE, norms and the head run
        over the concatenated rows; attention, compressors and indexers run per request on its own
        cache. Each output equals what `forward` gives for that input alone (to float rounding; bit for
        bit with `deterministic` on, see `run_batch`)."""
        return self.run_batch(inputs)

    @torch.no_grad()
    def forward_batch_to_kv_source(self, inputs: Sequence[SegmentInput]) -> None:
        """Bounded replay's prefix pass on the full model, for several requests' chunks in one pass (their rows
        batched as `forward_batch` batches them; with `deterministic`, a pass each): the layers before the last
        KV source on every row, then that layer's compressed rows and index keys only (no attention output, no
        FFN); the layers from the last KV source on keep no window rows below the chunk's end (their window
        starts there). Every input is checked before any cache changes (InvalidSegment names the first that
        cannot run)."""
        if self.role != "full":
            raise ValueError("forward_batch_to_kv_source needs the full model (the prefill role always stops there)")
        self._check_batch(inputs)
        late = range(self.plan.last_kv_source, self.cfg.num_hidden_layers)
        for i, item in enumerate(inputs):
            if any(len(item.cache.groups.get(swa_group(layer), ())) for layer in late):
                raise InvalidSegment(i, RuntimeError(f"{swa_group(late[0])}.. already holds rows: a bounded-replay "
                                                     "prefix pass must precede every full forward of the request"))
        for group in ([[item] for item in inputs] if self.deterministic else [inputs]):
            self._run_rows(group, stop_at_kv_source=True)
        for item in inputs:
            for layer in late:
                item.cache.start_swa_at(layer, item.cache.pos)

    def run_batch(self, inputs: Sequence[SegmentInput]) -> list[SegmentOutput]:
        """`forward_batch` without its no_grad: autograd records the pass when the caller enables it
        (training). With `self.deterministic` each input runs as its own pass after all are checked,
        so a request's logits do not depend on what else shares the batch."""
        if self.deterministic and len(inputs) > 1:
            self._check_batch(inputs)
            outputs = [self._run_rows([item])[0] for item in inputs]
            self.captured = {}
            return outputs
        return self._run_rows(inputs)

    def _check_batch(self, inputs: Sequence[SegmentInput]) -> None:
        if not inputs:
            raise ValueError("forward_batch needs at least one input")
        seen: set[int] = set()
        for i, item in enumerate(inputs):  # every input is checked before any cache changes
            try:
                self.check_input(item)
                if id(item.cache) in seen:
                    raise ValueError("one request cache appears twice in a batch")
            except Exception as exc:
                raise InvalidSegment(i, exc) from exc
            seen.add(id(item.cache))

    def _run_rows(self, inputs: Sequence[SegmentInput], stop_at_kv_source: bool = False) -> list[SegmentOutput]:
        self._check_batch(inputs)
        device = self.embed.weight.device
        tokens = torch.cat([item.tokens for item in inputs]).to(device).long()
        segments, positions, row = [], [], 0
        for item in inputs:
            n, start = item.tokens.numel(), item.cache.pos
            pos = torch.arange(start, start + n, device=device)
            positions.append(pos)
            segments.append(Segment(slice(row, row + n), item.cache, ChunkState(positions=pos)))
            row += n
        batch = RowBatch(torch.cat(positions), segments)
        streams = self.embed(tokens).unsqueeze(1).expand(-1, self.cfg.hc_mult, -1)
        pre = torch.zeros(tokens.numel(), self.cfg.hc_mult, dtype=torch.float32, device=device)
        pre[:, 0] = 1
        wanted = set().union(*(item.capture for item in inputs))
        captured: dict[int, torch.Tensor] = {}
        ran = []
        for block in self.layers:
            ran.append(block.info.index)
            if block.info.index in wanted:
                captured[block.info.index] = streams.float().mean(dim=1).to(streams.dtype)
            if isinstance(block, KVPathBlock):
                block(streams, pre, batch, self.quant)
                break
            if stop_at_kv_source and block.info.index == self.plan.last_kv_source:
                block.write_kv_source_rows(streams, pre, batch, self.quant)
                break
            streams, pre = block(streams, pre, batch, self.quant)
        self.layers_run = tuple(ran)  # layer ids the last forward executed (KV path counts as its layer)
        self.captured = {}
        for item, seg in zip(inputs, segments):
            item.cache.pos = seg.start + item.tokens.numel()
        logit_rows = [] if self.role == "prefill" or stop_at_kv_source else self._logit_rows(inputs, segments)
        if logit_rows:
            picked = torch.cat([rows for _, rows in logit_rows])
            hidden = collapse(streams[picked], pre[picked])
            head_out = nn.functional.linear(self.norm(hidden).float(), self.head.weight)
        outputs, offset, by_input = [], 0, dict(logit_rows)
        for i, item in enumerate(inputs):
            seg_logits = None
            if i in by_input:
                n = by_input[i].numel()
                seg_logits = head_out[offset : offset + n]
                offset += n
                if item.logits == "last":
                    seg_logits = seg_logits[0]
            outputs.append(SegmentOutput(seg_logits, {layer: captured[layer][segments[i].rows]
                                                      for layer in item.capture}))
        return outputs

    def check_input(self, item: SegmentInput) -> None:
        """Raise if this input cannot run (released or foreign cache, bad tokens, inconsistent cache);
        touches nothing, so a caller can refuse one request before a batched forward."""
        cache = item.cache
        if cache.released:
            raise RuntimeError("cache was released")
        if cache.set.role != self.role:
            raise ValueError(f"a {cache.set.role}-role cache cannot serve a {self.role}-role model")
        if item.logits not in ("last", "all", "none"):
            raise ValueError(f"logits must be 'last', 'all' or 'none', got {item.logits!r}")
        self.validate_tokens(item.tokens, cache.pos)
        pos = cache.pos
        for block in self.layers:  # the rows each layer extends must end where the new tokens start
            layer = block.info.index
            if not isinstance(block, KVPathBlock):
                window = cache.groups.get(swa_group(layer))
                if (window.end if window is not None else 0) != pos:
                    raise RuntimeError(f"layer {layer}: window rows end at {0 if window is None else window.end}, "
                                       f"the request is at position {pos}")
            if block.info.owns_kv:
                rows = cache.groups.get(kv_group(layer))
                want = pos // block.info.ratio
                if (rows.end if rows is not None else 0) != want:
                    raise RuntimeError(f"layer {layer}: {0 if rows is None else rows.end} compressed rows stored, "
                                       f"position {pos} needs {want}")

    @staticmethod
    def _logit_rows(inputs: Sequence[SegmentInput], segments: list[Segment]) -> list[tuple[int, torch.Tensor]]:
        """(input index, batch row ids) of every row whose logits are asked for."""
        out = []
        for i, (item, seg) in enumerate(zip(inputs, segments)):
            if item.logits == "all":
                out.append((i, torch.arange(seg.rows.start, seg.rows.stop)))
            elif item.logits == "last":
                out.append((i, torch.tensor([seg.rows.stop - 1])))
        return out
