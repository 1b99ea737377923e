"""Test drafters: a constant (deliberately wrong) one, and the target drafting for itself.

Any drafter must leave greedy output unchanged; these make acceptance patterns that random DSpark
weights never reach (all wrong, right up to a chosen index, exactly the target)."""

from __future__ import annotations

from typing import Mapping

import torch

from sglang_asym.model import V41Model
from sglang_asym.model.dspark import Chooser, Draft


class ConstantDrafter:
    """Always proposes the same token: deliberately wrong (accepted only where the target agrees)."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, token: int, vocab_size: int, max_draft: int) -> None:
        self.token, self.vocab_size, self.max_draft = token, vocab_size, max_draft

    def new_state(self) -> None:
        return None

    def observe(self, state, captured: Mapping[int, torch.Tensor], first_pos: int) -> None:
        pass

    def rollback(self, state, pos: int) -> None:
        pass

    def propose(self, state, anchor: int, pos: int, k: int, choose: Chooser) -> Draft:
        logits = torch.full((k, self.vocab_size), -30.0)
        logits[:, self.token] = 30.0
        return Draft(tuple(choose(row) for row in logits), logits)


class TeacherDrafter:
    """Drafts with the target itself: each proposal runs the committed sequence plus the anchor on a
    scratch cache and decodes k tokens there, so q is the target's p (up to the rounding of another batch
    shape). `corrupt_at[step % len]` (if < k) replaces that draft with a wrong token, which yields every
    accepted length 0 .. k. It learns what was committed from its own previous drafts and the new position."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, target: V41Model, prompt: torch.Tensor, max_draft: int, corrupt_at: tuple[int, ...] = ()) -> None:
        self.target, self.max_draft, self.corrupt_at = target, max_draft, corrupt_at
        self.scratch = target.new_cache_set()
        self.committed = prompt.tolist()  # tokens at positions [0, len)
        self.previous: tuple[int, list[int]] | None = None  # the last proposal's anchor and drafts
        self.steps = 0

    def new_state(self) -> None:
        return None

    def observe(self, state, captured: Mapping[int, torch.Tensor], first_pos: int) -> None:
        pass

    def rollback(self, state, pos: int) -> None:
        pass

    def propose(self, state, anchor: int, pos: int, k: int, choose: Chooser) -> Draft:
        if self.previous is not None:
            last_anchor, drafts = self.previous
            self.committed += [last_anchor] + drafts[: pos - len(self.committed) - 1]
        assert len(self.committed) == pos
        bad = self.corrupt_at[self.steps % len(self.corrupt_at)] if self.corrupt_at else k
        self.steps += 1
        cache = self.scratch.new_request()
        rows = [self.target(torch.tensor(self.committed + [anchor]), cache)]
        tokens: list[int] = []
        for j in range(k):
            token = choose(rows[-1])
            tokens.append((token + 1) % self.target.cfg.vocab_size if j == bad else token)
            if j + 1 < k:
                rows.append(self.target(torch.tensor([tokens[-1]]), cache))
        cache.release()
        self.previous = (anchor, tokens)
        return Draft(tuple(tokens), torch.stack(rows))
