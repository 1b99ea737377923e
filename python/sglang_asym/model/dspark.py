"""DSpark-shaped drafter: SWA-only draft blocks that propose a block of tokens in one parallel pass.

Shape (the released V4.1 DSpark; facts read from NVIDIA nemo-automodel's module, own implementation):
- Target features: the mean of the target's residual streams at the inputs of `dspark_target_layer_ids`,
  concatenated in that order ([T, n * hidden]). Block 0 projects them once (`main_proj`, `main_norm`) to
  one context state per target position; every block turns that state into its own key/value row
  (wkv, kv_norm, RoPE at the target position), like a window KV row of the backbone.
- A draft for anchor position a (the last committed token, not yet run by the target) is a block of
  `dspark_block_size` slots at positions a .. a+S-1 holding the anchor's embedding, then the noise
  token's. Each slot attends the context rows of positions [a - W, a) and every slot of its own block
  (bidirectional), plus a per-head sink logit; MoE with the draft expert counts; mHC as in the backbone.
  The block always runs all S slots (as trained); a proposal of k < S tokens reads the first k.
- The last block's `norm` feeds the target's lm head; a rank-r Markov head adds a transition bias from
  the slot's previous token (the anchor for slot 0, then the previous draft). Slot j's logits predict
  the token at position a + j + 1. The confidence head's logit per slot is returned with the draft.
- Embedding, lm head and the cache-row quantizer are the target's (shared, not copied).

Per request the drafter keeps DraftRings: per block, the context rows of the last W + S positions,
appended from every target forward that captured features and truncated like the target cache when
a speculative suffix is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from ..checkpoint.random_init import random_weights
from ..checkpoint.specs import dspark_tensor_specs
from ..config import ConfigError, V41Config
from .attention import LatentProjections
from .block import MixedSublayers
from .mhc import collapse
from .model import V41Model
from .moe import MoE
from .primitives import RMSNorm, RopeTable, apply_rope, grouped_linear
from .quant import Quantizer


# ---- weights ---------------------------------------------------------------------------------
def random_drafter_weights(cfg: V41Config, seed: int) -> dict[str, torch.Tensor]:
    """The `mtp.*` tensors of a random checkpoint of `seed` (checkpoint.random_weights' draws)."""
    return random_weights(cfg, seed, include_extras=True, names=[s.name for s in dspark_tensor_specs(cfg)])


# ---- per-request context rings ----------------------------------------------------------------
class DraftRings:
    """One request's drafter context: for each draft block the key/value row of each recent target
    position, in a ring of `capacity` rows (window + block size: a verify step's 1 + k rows can be
    appended and the window before the accepted end is still held)."""

    def __init__(self, blocks: int, capacity: int, head_dim: int, dtype: torch.dtype, device) -> None:
        self.rows = torch.zeros(blocks, capacity, head_dim, dtype=dtype, device=device)
        self.begin: int | None = None  # first position ever observed: no context exists below it
        self.end = 0  # one past the last position held
        self.low = 0  # rows below it were overwritten (or skipped) and cannot be read

    @property
    def capacity(self) -> int:
        return self.rows.shape[1]

    def _start_or_check(self, first_pos: int) -> None:
        if self.begin is None:
            self.begin = self.low = self.end = first_pos
        elif first_pos != self.end:
            raise ValueError(f"drafter context ends at position {self.end}; rows from {first_pos} do not follow it")

    def skip(self, first_pos: int, to: int) -> None:
        """Positions [first_pos, to) will never be read (far outside the window): advance past them."""
        self._start_or_check(first_pos)
        self.end = self.low = to

    def append(self, rows: torch.Tensor, first_pos: int) -> None:
        """rows [blocks, T, head_dim] for positions [first_pos, first_pos + T)."""
        self._start_or_check(first_pos)
        n = rows.shape[1]
        keep = min(n, self.capacity)
        slots = torch.arange(first_pos + n - keep, first_pos + n, device=self.rows.device) % self.capacity
        self.rows[:, slots] = rows[:, n - keep :].to(self.rows.dtype)
        self.end = first_pos + n
        self.low = max(self.low, self.end - self.capacity)

    def read(self, start: int, end: int) -> torch.Tensor:
        if self.begin is None or not max(self.begin, self.low) <= start <= end <= self.end:
            raise IndexError(f"drafter context rows [{start}, {end}) are not held "
                             f"(held: [{max(self.begin or 0, self.low)}, {self.end}))")
        slots = torch.arange(start, end, device=self.rows.device) % self.capacity
        return self.rows[:, slots]

    def truncate(self, pos: int) -> None:
        """Forget positions >= pos (a rejected speculative suffix)."""
        if self.begin is None or not self.begin <= pos <= self.end:
            raise ValueError(f"cannot roll the drafter context back to {pos}: it holds [{self.begin}, {self.end})")
        if pos < self.low:
            raise ValueError(f"cannot roll the drafter context back to {pos}: rows below {self.low} are no longer kept")
        self.end = pos


# ---- modules (parameter names follow the released `mtp.{k}.*` tensors) -------------------------
class DraftAttention(LatentProjections):
    """Window attention of draft slots over the context rows and their own block, one latent KV head."""

    def __init__(self, cfg: V41Config, dtype: torch.dtype) -> None:
        super().__init__(cfg, dtype)
        self.rope = RopeTable(cfg, compressed=False)  # draft layers have compress ratio 0

    def kv_rows(self, h: torch.Tensor, positions: torch.Tensor, quant: Quantizer) -> torch.Tensor:
        return quant.swa_kv(apply_rope(self.kv_norm(self.wkv(h)), self.rope.angles(positions)))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, context: torch.Tensor, context_valid: torch.Tensor,
                quant: Quantizer) -> torch.Tensor:
        """x [A*S, hidden] for A blocks of S slots; context [A, C, head_dim] with context_valid [A, C]."""
        cfg = self.cfg
        blocks = context_valid.shape[0]
        slots = x.shape[0] // blocks
        angles = self.rope.angles(positions)
        q = apply_rope(self.wq_b(self.q_norm(self.wq_a(x))).unflatten(-1, (cfg.num_attention_heads, cfg.head_dim)),
                       angles)
        own = self.kv_rows(x, positions, quant).view(blocks, slots, cfg.head_dim)
        keys = torch.cat((context.to(own.dtype), own), dim=1).float()
        valid = torch.cat((context_valid, context_valid.new_ones(blocks, slots)), dim=1)
        scores = torch.einsum("ashd,akd->ashk", q.view(blocks, slots, *q.shape[1:]).float(), keys)
        scores = (scores * cfg.head_dim ** -0.5).masked_fill(~valid[:, None, None, :], -torch.inf)
        sink = self.attn_sink.float().view(1, 1, -1, 1).expand(blocks, slots, -1, 1)
        probs = torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :-1]
        attended = torch.einsum("ashk,akd->ashd", probs, keys).flatten(0, 1).to(x.dtype)
        attended = apply_rope(attended, angles, inverse=True)
        grouped = grouped_linear(attended.reshape(x.shape[0], cfg.o_groups, -1), self.wo_a.weight, cfg.o_groups)
        return self.wo_b(grouped.flatten(1))


class MarkovHead(nn.Module):
    """Rank-r first-order transition bias: previous token -> [vocab] logits (and its embedding)."""

    def __init__(self, vocab: int, rank: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, rank, dtype=dtype)
        self.head = nn.Linear(rank, vocab, bias=False, dtype=dtype)

    def forward(self, previous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.embed(previous)
        return self.head(emb).float(), emb


class ConfidenceHead(nn.Module):
    """Acceptance logit per slot from the normalized draft state and the Markov embedding (fp32)."""

    def __init__(self, hidden: int, rank: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden + rank, 1, bias=False, dtype=torch.float32)

    def forward(self, normed: torch.Tensor, markov_emb: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat((normed.float(), markov_emb.float()), dim=-1)).squeeze(-1)


class DraftBlock(MixedSublayers):
    def __init__(self, cfg: V41Config, index: int, dtype: torch.dtype) -> None:
        super().__init__(cfg, dtype)
        h = cfg.hidden_size
        self.attn = DraftAttention(cfg, dtype)
        draft_moe = cfg.replace(n_routed_experts=cfg.dspark_n_routed_experts,
                                num_experts_per_tok=min(cfg.dspark_num_experts_per_tok, cfg.dspark_n_routed_experts))
        self.ffn = MoE(draft_moe, dtype)
        if index == 0:
            self.main_proj = nn.Linear(h * len(cfg.dspark_target_layer_ids), h, bias=False, dtype=dtype)
            self.main_norm = RMSNorm(h, cfg.rms_norm_eps, dtype)
        if index == cfg.num_nextn_predict_layers - 1:
            self.norm = RMSNorm(h, cfg.rms_norm_eps, dtype)
            self.markov_head = MarkovHead(cfg.vocab_size, cfg.dspark_markov_rank, dtype)
            self.confidence_head = ConfidenceHead(h, cfg.dspark_markov_rank)

    def forward(self, streams: torch.Tensor, pre: torch.Tensor, positions: torch.Tensor, context: torch.Tensor,
                context_valid: torch.Tensor, quant: Quantizer) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sublayers(streams, pre, lambda x: self.attn(x, positions, context, context_valid, quant))


@dataclass(frozen=True)
class SharedWithTarget:
    """The target's parts the drafter uses without owning them (kept out of its state dict)."""

    embed: nn.Embedding
    head: nn.Linear
    quant: Quantizer


@dataclass(frozen=True)
class Draft:
    """k proposed tokens after an anchor, the logits each was chosen from ([k, vocab] fp32) and, for
    DSpark, the confidence head's acceptance logit per token ([k], None for drafters without one)."""

    tokens: tuple[int, ...]
    logits: torch.Tensor
    confidence: torch.Tensor | None = None


# A chooser picks slot j's token from its logits; the speculative loop supplies it (greedy or sampled).
Chooser = Callable[[torch.Tensor], int]


class DSparkDrafter(nn.Module):
    """The `mtp.*` draft blocks over a full-role V41Model (whose embed and head it shares)."""

    def __init__(self, target: V41Model) -> None:
        super().__init__()
        cfg = target.cfg
        _validate(cfg, target)
        self.cfg, self.dtype = cfg, target.dtype
        self.shared = SharedWithTarget(target.embed, target.head, target.quant)
        with torch.device(target.embed.weight.device):
            self.mtp = nn.ModuleList(DraftBlock(cfg, k, self.dtype) for k in range(cfg.num_nextn_predict_layers))
        self.requires_grad_(False)

    # ---- facts the speculative loop reads ------------------------------------------------------
    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.cfg.dspark_target_layer_ids

    @property
    def max_draft(self) -> int:
        return self.cfg.dspark_block_size

    # ---- weights -------------------------------------------------------------------------------
    def expected_tensor_names(self) -> frozenset[str]:
        return frozenset(self.state_dict())

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy released `mtp.*` tensors in (other names are ignored); every draft tensor must be present."""
        own = self.state_dict()
        missing = sorted(set(own) - weights.keys())
        if missing:
            raise KeyError(f"weights are missing {len(missing)} DSpark tensor(s), e.g. {missing[:5]}")
        for name in own:
            value = weights[name]
            if tuple(value.shape) != tuple(own[name].shape):
                raise ValueError(f"tensor {name}: shape {tuple(value.shape)} != expected {tuple(own[name].shape)}")
            own[name].copy_(value.to(own[name].dtype))

    # ---- differentiable pieces (used by propose and by scripts/distill_drafter.py) ---------------
    def context_rows(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Target features [T, n * hidden] at `positions` -> every block's context rows [blocks, T, head_dim]."""
        first = self.mtp[0]
        state = first.main_norm(first.main_proj(features.to(self.dtype)))
        return torch.stack([block.attn.kv_rows(state, positions, self.shared.quant) for block in self.mtp])

    def hidden(self, anchors: torch.Tensor, anchor_pos: torch.Tensor, context: torch.Tensor,
               context_valid: torch.Tensor) -> torch.Tensor:
        """A blocks: anchor ids [A], their positions [A], context rows [blocks, A, C, head_dim] with a
        validity mask [A, C] -> the final normalized draft states [A, S, hidden]."""
        cfg, size = self.cfg, self.cfg.dspark_block_size
        ids = torch.full((anchors.shape[0], size), cfg.dspark_noise_token_id, dtype=torch.long, device=anchors.device)
        ids[:, 0] = anchors
        positions = (anchor_pos.unsqueeze(1) + torch.arange(size, device=anchors.device)).flatten()
        streams = self.shared.embed(ids.flatten()).unsqueeze(1).expand(-1, cfg.hc_mult, -1)
        pre = torch.zeros(streams.shape[0], cfg.hc_mult, dtype=torch.float32, device=streams.device)
        pre[:, 0] = 1
        for block, rows in zip(self.mtp, context):
            streams, pre = block(streams, pre, positions, rows, context_valid, self.shared.quant)
        return self.mtp[-1].norm(collapse(streams, pre)).view(anchors.shape[0], size, -1)

    def vocab_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """The target's lm head on draft states, in fp32 like the target's own logits."""
        return F.linear(normed.float(), self.shared.head.weight.float())

    def transition(self, previous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mtp[-1].markov_head(previous)

    # ---- per-request use (the speculative.Drafter protocol) ---------------------------------------
    def new_state(self) -> DraftRings:
        cfg = self.cfg
        return DraftRings(len(self.mtp), cfg.sliding_window + cfg.dspark_block_size, cfg.head_dim, self.dtype,
                          self.shared.embed.weight.device)

    @torch.no_grad()
    def observe(self, state: DraftRings, captured: Mapping[int, torch.Tensor], first_pos: int) -> None:
        """Add the features a target forward over positions [first_pos, first_pos + T) captured."""
        missing = [layer for layer in self.feature_layers if layer not in captured]
        if missing:
            raise ValueError(f"the target forward did not capture layers {missing}: run it with "
                             f"capture=drafter.feature_layers")
        features = torch.cat([captured[layer] for layer in self.feature_layers], dim=-1)
        skip = max(0, features.shape[0] - state.capacity)
        if skip:
            state.skip(first_pos, first_pos + skip)
        positions = torch.arange(first_pos + skip, first_pos + features.shape[0], device=features.device)
        state.append(self.context_rows(features[skip:], positions), first_pos + skip)

    def rollback(self, state: DraftRings, pos: int) -> None:
        state.truncate(pos)

    @torch.no_grad()
    def propose(self, state: DraftRings, anchor: int, pos: int, k: int, choose: Chooser) -> Draft:
        """k tokens after `anchor` (at position `pos`) from one parallel pass of the block."""
        if not 1 <= k <= self.max_draft:
            raise ValueError(f"k must be in [1, {self.max_draft}] (dspark_block_size), got {k}")
        if state.begin is None:
            raise ValueError("the drafter has no context yet: observe the prompt's captured features first")
        if state.end != pos:
            raise ValueError(f"drafter context ends at position {state.end} but the anchor is at {pos}: "
                             "observe every target forward's captured features")
        start = max(state.begin, pos - self.cfg.sliding_window)
        context = state.read(start, pos).unsqueeze(1)
        device = context.device
        valid = torch.ones(1, pos - start, dtype=torch.bool, device=device)
        normed = self.hidden(torch.tensor([anchor], device=device), torch.tensor([pos], device=device), context,
                             valid)[0, :k]
        base = self.vocab_logits(normed)
        tokens, logits, confidence = [], [], []
        previous = anchor
        for j in range(k):
            bias, emb = self.transition(torch.tensor(previous, device=device))
            logits.append(base[j] + bias)
            confidence.append(self.mtp[-1].confidence_head(normed[j], emb))
            previous = choose(logits[-1])
            tokens.append(previous)
        return Draft(tuple(tokens), torch.stack(logits), torch.stack(confidence))


def _validate(cfg: V41Config, target: V41Model) -> None:
    if target.role != "full":
        raise ValueError("the DSpark drafter needs the full-role target model (it shares its lm head)")
    if cfg.num_nextn_predict_layers < 1:
        raise ConfigError("num_nextn_predict_layers must be >= 1 for a DSpark drafter")
    if type(cfg.dspark_block_size) is not int or cfg.dspark_block_size < 1:
        raise ConfigError(f"dspark_block_size must be a positive integer, got {cfg.dspark_block_size!r}")
    layers = cfg.dspark_target_layer_ids
    if not layers or any(not 0 <= layer < cfg.num_hidden_layers for layer in layers):
        raise ConfigError(f"dspark_target_layer_ids must be target layers in [0, {cfg.num_hidden_layers}), "
                          f"got {list(layers)}")
    if cfg.dspark_markov_rank < 1 or cfg.dspark_n_routed_experts < 1 or cfg.dspark_num_experts_per_tok < 1:
        raise ConfigError("dspark_markov_rank, dspark_n_routed_experts and dspark_num_experts_per_tok must be >= 1")
    if not 0 <= cfg.dspark_noise_token_id < cfg.vocab_size:
        raise ConfigError(f"dspark_noise_token_id {cfg.dspark_noise_token_id} is outside the vocabulary")
