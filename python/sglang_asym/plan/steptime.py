"""The step-time interface the planner and the simulator share, and the roles a replica can play."""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Sequence


class Role(str, Enum):
    """Which weights a prefill replica runs a prompt through."""

    ASYM_P = "asym_p"  # embeddings, layers 0-19 and layer 20's KV path, over [0, N - W)
    RFC_P = "rfc_p"  # vLLM RFC #57738: the same layers over the whole prompt [0, N) (the full model stays loaded)
    SYM_P = "sym_p"  # symmetric PD's P with SGLang's bounded replay: layers 0-19 over [0, N), layer 20's KV path,
    #                  layers 20-39 and the head over each prompt's last W rows
    FULL = "full"  # all 40 layers and the head on every row (D, a colocated replica's prefill, full-compute P)
    LATE = "late"  # layers 20-39 and the head alone: the replayed rows of SYM_P (never a replica's role)


class StepTimeModel(ABC):
    """Seconds of one decode-worker step and of prefill work, for one replica."""

    name: str

    @abstractmethod
    def decode_step_s(self, decode_contexts: Sequence[int], window_chunks: Sequence[int] = ()) -> float:
        """One step of a decode replica (one DP rank's rows when the replica runs DP attention): one row per
        running request at its context, plus one window chunk (its rows) per new request admitted."""

    @abstractmethod
    def prefill_s(self, tokens: int, role: Role, context: int = 0) -> float:
        """`tokens` prompt tokens computed after `context` earlier tokens of the same prompt."""

    def prefill_step_s(self, segments: Sequence[tuple[int, int]], role: Role) -> float:
        """One prefill forward packing several prompts' chunks: (tokens, context before them) per prompt.
        By default the chunks run one after the other; models whose weights are read once per forward
        override this."""
        return sum(self.prefill_s(tokens, role, context) for tokens, context in segments)
