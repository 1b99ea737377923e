"""One greedy speculative step of SGLang's DSpark decoding on CPU, over plain tensors (no SGLang imports).

The platform's speculative worker (dspark_worker.py) drives SGLang's scheduler; this module is what it does
per step, so it can be tested against the whole-forward reference without servers:
  draft     each request's drafter context (`DraftContexts`, by SGLang req slot and checked against the
            request id) proposes k tokens after the bonus token (the last committed token, at position
            seq_len, not yet run by the target);
  verify    ONE target forward over [bonus, d1 .. dk] per request (SGLang's TARGET_VERIFY batch: q_len
            1 + k), every row's logits and the drafter's features of every row;
  accept    SGLang's greedy rule (compute_dflash_correct_drafts_and_bonus): the longest prefix of drafts
            equal to the target's argmax, then the target's argmax after it (the new bonus token);
  commit    each request's drafter context takes the verify rows' features and rolls back to the
            committed length seq_len + accepted + 1.
The emitted tokens are what greedy decoding emits over the same verify forwards, whatever the drafts are:
the drafts only decide how many tokens a step emits. (A verify forward of 1 + k rows can round otherwise
than 1 + k one-row decode steps; with the rows run one per forward, --enable-deterministic-inference,
they are plain greedy decoding's tokens bit for bit.) A request without a drafter context that continues at seq_len (a request
SGLang placed without showing this worker its prompt's forward) drafts the bonus token repeated, and its
context starts from the verify rows' features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ...speculative import Drafter


def _argmax(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


@dataclass
class _Context:
    rid: str
    state: Any
    end: int  # one past the last position whose features the state holds


class DraftContexts:
    """The drafter state of each request SGLang runs, by req slot (a slot's next request gets a new one)."""

    def __init__(self, drafter: Drafter, feature_layers: Sequence[int]) -> None:
        """`feature_layers`: the layers, in order, whose inputs the target forward concatenates per row."""
        self.drafter = drafter
        self.feature_layers = tuple(feature_layers)
        self._by_slot: dict[int, _Context] = {}

    def __len__(self) -> int:
        return len(self._by_slot)

    def _captured(self, features: torch.Tensor) -> dict[int, torch.Tensor]:
        parts = features.chunk(len(self.feature_layers), dim=-1) if self.feature_layers else ()
        return dict(zip(self.feature_layers, parts))

    def _continuing(self, slot: int, rid: str, first_pos: int) -> _Context | None:
        ctx = self._by_slot.get(slot)
        return ctx if ctx is not None and ctx.rid == rid and ctx.end == first_pos else None

    def observe(self, slot: int, rid: str, features: torch.Tensor, first_pos: int) -> None:
        """Features [T, layers * hidden] of positions [first_pos, first_pos + T) (an extend forward's rows).
        Rows that do not continue the slot's context (a new request, a retracted one computed again) start
        a new one."""
        ctx = self._continuing(slot, rid, first_pos)
        if ctx is None:
            ctx = self._by_slot[slot] = _Context(rid, self.drafter.new_state(), first_pos)
        self.drafter.observe(ctx.state, self._captured(features), first_pos)
        ctx.end = first_pos + features.shape[0]

    def draft(self, slot: int, rid: str, anchor: int, pos: int, k: int) -> tuple[int, ...]:
        """k greedy draft tokens after `anchor` at position `pos`."""
        ctx = self._continuing(slot, rid, pos)
        if ctx is None:
            return (anchor,) * k
        tokens = self.drafter.propose(ctx.state, anchor, pos, k, _argmax).tokens
        if len(tokens) != k:
            raise RuntimeError(f"the drafter proposed {len(tokens)} tokens, {k} were asked for")
        return tuple(tokens)

    def commit(self, slot: int, rid: str, features: torch.Tensor, start: int, keep: int) -> None:
        """After a verify forward over positions [start, start + T): keep [start, keep), forget the rest."""
        self.observe(slot, rid, features, start)
        ctx = self._by_slot[slot]
        self.drafter.rollback(ctx.state, keep)
        ctx.end = keep

    def forget(self, rid: str) -> None:
        """A finished request's context (its slot may also be reused before this is called)."""
        for slot in [s for s, ctx in self._by_slot.items() if ctx.rid == rid]:
            del self._by_slot[slot]


@dataclass(frozen=True)
class VerifyRows:
    """What a verify forward gives: logits [bs * q, V] and the drafter's features [bs * q, layers * hidden],
    request after request."""

    logits: torch.Tensor
    features: torch.Tensor


@dataclass(frozen=True)
class StepOutcome:
    """A step's result in SGLang's layout (DSparkWorkerV2's AcceptOuts): out_tokens [bs, q] holds the
    accepted drafts, then the bonus at column correct_len (later columns are not read)."""

    verify_ids: torch.Tensor  # [bs, q]: the previous bonus token and the drafts
    correct_len: torch.Tensor  # [bs] int32: accepted drafts
    bonus: torch.Tensor  # [bs] int64: the target's token after them (the next step's anchor)
    out_tokens: torch.Tensor  # [bs, q] int64
    commit_lens: torch.Tensor  # [bs] int32: correct_len + 1
    new_seq_lens: torch.Tensor  # [bs] int64


def accept_greedy(verify_ids: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's greedy verify rule: accept while verify_ids[:, 1:] == argmax[:, :-1] consecutively."""
    bs, q = verify_ids.shape
    best = logits.argmax(dim=-1).view(bs, q)
    matches = (verify_ids[:, 1:] == best[:, :-1]).to(torch.int32)
    correct_len = matches.cumprod(dim=1).sum(dim=1).to(torch.int32)
    bonus = best[torch.arange(bs), correct_len.long()].to(torch.int64)
    return correct_len, bonus


def speculative_step(contexts: DraftContexts, slots: Sequence[int], rids: Sequence[str], bonus: torch.Tensor,
                     seq_lens: torch.Tensor, k: int, verify: Callable[[torch.Tensor], VerifyRows]) -> StepOutcome:
    """Draft, verify (`verify(verify_ids [bs, 1 + k])` runs the target forward), accept, commit."""
    bs, q = len(slots), k + 1
    anchors, starts = bonus.view(-1).tolist(), seq_lens.tolist()
    drafts = [contexts.draft(slot, rid, int(a), int(s), k) for slot, rid, a, s in zip(slots, rids, anchors, starts)]
    verify_ids = torch.cat((bonus.view(-1, 1).to(torch.int64), torch.tensor(drafts, dtype=torch.int64).view(bs, k)),
                           dim=1)
    rows = verify(verify_ids)
    if rows.logits.shape[0] != bs * q or rows.features.shape[0] != bs * q:
        raise RuntimeError(f"the verify forward of {bs} requests x {q} rows gave {rows.logits.shape[0]} logits rows "
                           f"and {rows.features.shape[0]} feature rows")
    correct_len, new_bonus = accept_greedy(verify_ids, rows.logits)
    commit_lens = correct_len + 1
    for i, (slot, rid, start) in enumerate(zip(slots, rids, starts)):
        contexts.commit(slot, rid, rows.features[i * q:(i + 1) * q], int(start), int(start) + int(commit_lens[i]))
    out_tokens = verify_ids[:, 1:].clone()
    out_tokens = torch.cat((out_tokens, torch.zeros(bs, 1, dtype=torch.int64)), dim=1)
    out_tokens.scatter_(1, correct_len.long()[:, None], new_bonus[:, None])
    return StepOutcome(verify_ids, correct_len, new_bonus, out_tokens, commit_lens,
                       seq_lens.to(torch.int64) + commit_lens.to(torch.int64))
