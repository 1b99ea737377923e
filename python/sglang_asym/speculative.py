"""Exact speculative decoding over V41Model with any drafter (DSpark, or a test double).

A request in speculative decode holds the target cache over tokens [0, pos), the anchor (the last
committed token, at position pos, not yet run by the target) and the drafter's per-request state.
One step:
  propose   the drafter proposes k tokens after the anchor;
  verify    ONE target forward over [anchor, d1 .. dk] (q_len 1 + k), capturing the drafter's features;
  accept    greedy:   m = longest prefix with d_i == the target's argmax, then the target's argmax;
            sampling: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection
                      sample from norm(max(0, p_i - q_i)) and stop; if all k pass, a bonus token from p_k.
            Either way the emitted tokens are distributed exactly as decoding the target token by token;
  commit    the target cache and the drafter state roll back to pos + m + 1; the last emitted token
            becomes the new anchor.
p and q are `sampling.token_probs` of the target's and the drafter's logits under the same Sampling, the
filter the runtime's plain sampler draws from too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import torch

from .cache import RequestCache
from .cache.request import JOURNAL_TOKENS, ROLLBACK_MARGIN_ROWS
from .checkpoint import CheckpointError, dspark_tensor_specs, load_weights
from .checkpoint.reader import CheckpointReader
from .model.dspark import Chooser, Draft, DSparkDrafter
from .model.model import V41Model
from .sampling import GREEDY, Sampling, sample_token, token_probs  # noqa: F401 (sample_token: part of this API)

# The widest verify step a request cache can roll back (compressor journal and window margin).
MAX_VERIFY_WIDTH = min(JOURNAL_TOKENS, ROLLBACK_MARGIN_ROWS)


# ---- drafters and per-request state ---------------------------------------------------------------
class Drafter(Protocol):
    """What the speculative loop needs from a drafter (DSparkDrafter implements it)."""

    @property
    def feature_layers(self) -> tuple[int, ...]: ...  # target layers to capture for it (may be empty)

    @property
    def max_draft(self) -> int: ...  # the largest k it can propose

    def new_state(self) -> Any: ...

    def observe(self, state: Any, captured: Mapping[int, torch.Tensor], first_pos: int) -> None: ...

    def rollback(self, state: Any, pos: int) -> None: ...

    def propose(self, state: Any, anchor: int, pos: int, k: int, choose: Chooser) -> Draft: ...


@dataclass
class AcceptanceStats:
    """Counters over speculative steps. Position i counts steps that proposed a token at draft index i
    (k > i) and steps whose accepted prefix covered it (m > i)."""

    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def record(self, k: int, accepted: int) -> None:
        grow = k - len(self.proposed_at)
        if grow > 0:
            self.proposed_at += [0] * grow
            self.accepted_at += [0] * grow
        self.steps += 1
        self.proposed += k
        self.accepted += accepted
        self.emitted += accepted + 1
        for i in range(k):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < accepted

    def merge(self, other: "AcceptanceStats") -> None:
        for i, (p, a) in enumerate(zip(other.proposed_at, other.accepted_at)):
            if i == len(self.proposed_at):
                self.proposed_at.append(0)
                self.accepted_at.append(0)
            self.proposed_at[i] += p
            self.accepted_at[i] += a
        self.steps += other.steps
        self.proposed += other.proposed
        self.accepted += other.accepted
        self.emitted += other.emitted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    def per_position(self) -> list[float]:
        return [a / p if p else 0.0 for p, a in zip(self.proposed_at, self.accepted_at)]

    def as_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "proposed": self.proposed, "accepted": self.accepted, "emitted": self.emitted,
                "acceptance_rate": round(self.acceptance_rate, 4), "tokens_per_step": round(self.tokens_per_step, 4),
                "per_position_acceptance": [round(r, 4) for r in self.per_position()]}


@dataclass
class SpecRequest:
    """One request in speculative decode: the target cache holds [0, cache.pos), the anchor sits at cache.pos."""

    cache: RequestCache
    draft_state: Any
    anchor: int
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)

    @property
    def pos(self) -> int:
        return self.cache.pos


def prefill_for_drafting(target: V41Model, drafter: Drafter, cache: RequestCache, tokens: torch.Tensor,
                         chunk: int | None = None) -> tuple[torch.Tensor, Any]:
    """steps.prefill (whole, or in chunks of `chunk` tokens) that also feeds every forward's features to a
    new drafter state: (the last position's logits, the drafter state)."""
    size = tokens.numel() if chunk is None else chunk
    if size <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    target.validate_tokens(tokens, cache.pos)
    state = drafter.new_state()
    logits = None
    for a in range(0, tokens.numel(), size):
        first = cache.pos
        last_chunk = a + size >= tokens.numel()
        logits = target(tokens[a : a + size], cache, logits="last" if last_chunk else "none",
                        capture=drafter.feature_layers)
        drafter.observe(state, target.captured, first)
    return logits, state


# ---- the drafter of a checkpoint -----------------------------------------------------------------------
def max_draft_tokens(drafter_block_size: int) -> int:
    """The largest k a server accepts: the drafter's block and the widest verify a cache can roll back."""
    return min(drafter_block_size, MAX_VERIFY_WIDTH - 1)


def missing_drafter_tensors(directory: str | Path) -> list[str]:
    """The DSpark `mtp.*` tensors this checkpoint's config calls for that its files do not hold."""
    reader = CheckpointReader(directory)
    if reader.config.num_nextn_predict_layers < 1:
        return ["mtp.* (config.json has num_nextn_predict_layers = 0: no draft blocks)"]
    return [spec.name for spec in dspark_tensor_specs(reader.config) if spec.name not in reader.weight_map]


def drafter_from_checkpoint(target: V41Model, directory: str | Path) -> DSparkDrafter:
    """The checkpoint's DSpark drafter over an already loaded full target (sharing its embedding and head)."""
    missing = missing_drafter_tensors(directory)
    if missing:
        raise CheckpointError(f"{directory}: speculative decoding needs the DSpark drafter's mtp.* weights; "
                              f"{len(missing)} are missing, e.g. {missing[:3]}")
    drafter = DSparkDrafter(target)
    drafter.load_weights(load_weights(directory, sorted(drafter.expected_tensor_names()), progress=False))
    return drafter


# ---- one step ---------------------------------------------------------------------------------------
def check_draft_len(k: Any, drafter: Drafter) -> None:
    limit = min(drafter.max_draft, MAX_VERIFY_WIDTH - 1)
    if type(k) is not int or not 1 <= k <= limit:
        raise ValueError(f"k (draft tokens per step) must be an integer in [1, {limit}] "
                         f"(dspark_block_size {drafter.max_draft}), got {k!r}")


def propose(drafter: Drafter, req: SpecRequest, k: int, sampling: Sampling = GREEDY,
            generator: torch.Generator | None = None) -> tuple[Draft, torch.Tensor | None]:
    """k draft tokens and, when sampling, the distributions q [k, V] they were drawn from."""
    check_draft_len(k, drafter)
    drawn_from: list[torch.Tensor] = []

    def choose(logits: torch.Tensor) -> int:
        if sampling.greedy:
            return int(torch.argmax(logits))
        q = token_probs(logits, sampling)
        drawn_from.append(q)
        return int(torch.multinomial(q, 1, generator=generator))

    draft = drafter.propose(req.draft_state, req.anchor, req.pos, k, choose)
    if len(draft.tokens) != k:
        raise RuntimeError(f"the drafter proposed {len(draft.tokens)} tokens, {k} were asked for")
    return draft, (torch.stack(drawn_from) if drawn_from else None)


def verify(target: V41Model, drafter: Drafter, req: SpecRequest, draft_tokens: Sequence[int]) -> torch.Tensor:
    """ONE target forward over [anchor, drafts] (q_len 1 + k) -> logits [1 + k, V]; the drafter's
    features are left in target.captured."""
    tokens = torch.tensor([req.anchor, *draft_tokens], dtype=torch.long)
    return target(tokens, req.cache, logits="all", capture=drafter.feature_layers)


def accept_greedy(draft_tokens: Sequence[int], target_logits: torch.Tensor) -> list[int]:
    """The accepted drafts (longest prefix equal to the target's argmax) plus the target's next token."""
    _check_rows(len(draft_tokens), target_logits)
    best = torch.argmax(target_logits, dim=-1).tolist()
    m = 0
    while m < len(draft_tokens) and int(draft_tokens[m]) == best[m]:
        m += 1
    return [int(t) for t in draft_tokens[:m]] + [best[m]]


def accept_sampled(draft_tokens: Sequence[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                   generator: torch.Generator | None = None) -> list[int]:
    """The speculative sampling rule: the emitted tokens are distributed as sampling p token by token."""
    k = len(draft_tokens)
    _check_rows(k, target_probs)
    if draft_probs.shape != (k, target_probs.shape[-1]):
        raise ValueError(f"draft_probs must be [{k}, {target_probs.shape[-1]}], got {tuple(draft_probs.shape)}")
    out: list[int] = []
    for i, token in enumerate(int(t) for t in draft_tokens):
        p, q = target_probs[i].double(), draft_probs[i].double()
        q_x, p_x = float(q[token]), float(p[token])
        if q_x <= 0:
            raise ValueError(f"draft token {token} at index {i} has probability 0 under the distribution it was drawn from")
        u = float(torch.rand((), dtype=torch.float64, generator=generator))
        if u * q_x < p_x:  # u < p(x)/q(x): accepted with probability min(1, p(x)/q(x))
            out.append(token)
            continue
        residual = (p - q).clamp(min=0)
        if float(residual.sum()) <= 0:  # only reachable through rounding when p == q
            residual = p
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(target_probs[k].double(), 1, generator=generator)))
    return out


def accept(draft_tokens: Sequence[int], draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
           sampling: Sampling = GREEDY, generator: torch.Generator | None = None) -> list[int]:
    """The tokens a verify step emits: accept_greedy, or accept_sampled on the target's distributions."""
    if sampling.greedy:
        return accept_greedy(draft_tokens, target_logits)
    if draft_probs is None:
        raise ValueError("sampled drafts need the distributions they were drawn from (propose returns them)")
    return accept_sampled(draft_tokens, draft_probs, token_probs(target_logits, sampling), generator)


def commit(drafter: Drafter, req: SpecRequest, start: int, k: int, emitted: Sequence[int],
           captured: Mapping[int, torch.Tensor]) -> None:
    """After the verify forward over positions [start, start + 1 + k): keep the anchor and the accepted
    drafts (emitted[:-1]), roll the rest back; the last emitted token is the new anchor."""
    accepted = len(emitted) - 1
    if not 0 <= accepted <= k:
        raise ValueError(f"{len(emitted)} emitted tokens do not fit a step of k={k}")
    if req.pos != start + k + 1:
        raise ValueError(f"commit expects the verify forward of 1 + k = {k + 1} tokens from position {start}; "
                         f"the cache holds {req.pos} tokens")
    keep = start + accepted + 1
    drafter.observe(req.draft_state, captured, start)
    drafter.rollback(req.draft_state, keep)
    req.cache.truncate(keep)
    req.anchor = int(emitted[-1])
    req.stats.record(k, accepted)


def speculative_step(target: V41Model, drafter: Drafter, req: SpecRequest, k: int, sampling: Sampling = GREEDY,
                     generator: torch.Generator | None = None) -> list[int]:
    """Propose, verify, accept, commit: the 1 .. k + 1 tokens this step emits (the last is the new anchor)."""
    draft, q = propose(drafter, req, k, sampling, generator)
    start = req.pos
    logits = verify(target, drafter, req, draft.tokens)
    captured = target.captured
    emitted = accept(draft.tokens, q, logits, sampling, generator)
    commit(drafter, req, start, k, emitted, captured)
    return emitted


def generate(target: V41Model, drafter: Drafter, req: SpecRequest, max_new_tokens: int, k: int,
             sampling: Sampling = GREEDY, generator: torch.Generator | None = None,
             stop_token_ids: Sequence[int] = ()) -> list[int]:
    """Tokens after the current anchor, up to max_new_tokens (or through the first stop token). The last
    step may emit past the limit; the surplus is dropped (the request is finished, its cache no longer used)."""
    check_draft_len(k, drafter)
    stops = set(stop_token_ids)
    out: list[int] = []
    while len(out) < max_new_tokens:
        step_k = max(1, min(k, max_new_tokens - len(out) - 1))
        for token in speculative_step(target, drafter, req, step_k, sampling, generator):
            out.append(token)
            if token in stops or len(out) == max_new_tokens:
                return out
    return out


def _check_rows(k: int, target_rows: torch.Tensor) -> None:
    if target_rows.ndim != 2 or target_rows.shape[0] != k + 1:
        raise ValueError(f"the target gives one row per verified token: expected [{k + 1}, V], "
                         f"got {tuple(target_rows.shape)}")
