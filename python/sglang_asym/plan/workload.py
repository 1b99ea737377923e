"""Workloads: prompt and output length distributions, and the presets (chat, summarization, reasoning, DeepSeek's mix).

Preset means follow the public ratios r = input / output tokens: chat r = 4, summarization r = 20,
reasoning r = 1/6, and DeepSeek's disclosed 608B input : 168B output tokens a day (r = 3.62). Lengths are
lognormal around those means (the spread is an assumption; docs/planning.md), clipped to the context.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import Enum

from .errors import PlanInputError

MAX_CONTEXT = 1_048_576  # V4.1-Flash max_position_embeddings


class DistKind(str, Enum):
    FIXED = "fixed"
    UNIFORM = "uniform"
    LOGNORMAL = "lognormal"


@dataclass(frozen=True)
class LengthDist:
    """Token counts: fixed(mean), uniform[low, high] or lognormal(mean, sigma) clipped to [low, high]."""

    kind: DistKind
    mean: float
    low: int = 1
    high: int = MAX_CONTEXT
    sigma: float = 0.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", DistKind(self.kind))
        except ValueError:
            raise PlanInputError(f"length distribution must be one of {[k.value for k in DistKind]}, "
                                 f"got {self.kind!r}") from None
        if isinstance(self.mean, bool) or not isinstance(self.mean, (int, float)) or not math.isfinite(self.mean) \
                or self.mean < 1:
            raise PlanInputError(f"mean length must be a finite number >= 1 token, got {self.mean!r}")
        if not (isinstance(self.low, int) and isinstance(self.high, int) and 1 <= self.low <= self.high):
            raise PlanInputError(f"length bounds need 1 <= low <= high, got [{self.low!r}, {self.high!r}]")
        if self.sigma < 0 or (self.kind is DistKind.LOGNORMAL and self.sigma == 0):
            raise PlanInputError(f"lognormal lengths need sigma > 0, got {self.sigma!r}")

    @classmethod
    def fixed(cls, n: int) -> "LengthDist":
        return cls(DistKind.FIXED, n, n, n)

    @classmethod
    def uniform(cls, low: int, high: int) -> "LengthDist":
        return cls(DistKind.UNIFORM, (low + high) / 2, low, high)

    @classmethod
    def lognormal(cls, mean: float, sigma: float, high: int = MAX_CONTEXT) -> "LengthDist":
        return cls(DistKind.LOGNORMAL, mean, 1, high, sigma)

    def sample(self, rng: random.Random) -> int:
        if self.kind is DistKind.FIXED:
            return int(self.mean)
        if self.kind is DistKind.UNIFORM:
            return rng.randint(self.low, self.high)
        mu = math.log(self.mean) - self.sigma ** 2 / 2  # so the unclipped mean is `mean`
        return int(min(max(round(rng.lognormvariate(mu, self.sigma)), self.low), self.high))


@dataclass(frozen=True)
class Workload:
    """A request mix: prompt and output lengths."""

    name: str
    input: LengthDist
    output: LengthDist

    def __post_init__(self) -> None:
        if not isinstance(self.input, LengthDist) or not isinstance(self.output, LengthDist):
            raise PlanInputError("a workload needs LengthDist input and output lengths")
        if self.input.high + self.output.high > MAX_CONTEXT * 2:
            raise PlanInputError("prompt + output bounds exceed the model's context")

    @property
    def ratio(self) -> float:
        """r = mean input / mean output tokens."""
        return self.input.mean / self.output.mean

    def sample(self, n: int, seed: int) -> list[tuple[int, int]]:
        """n (prompt tokens, output tokens) pairs, reproducible from the seed; prompt + output fits the context."""
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            i = self.input.sample(rng)
            o = self.output.sample(rng)
            out.append((min(i, MAX_CONTEXT - o), o))
        return out


PRESETS: dict[str, Workload] = {
    "chat": Workload("chat", LengthDist.lognormal(2000, 0.8, 131072), LengthDist.lognormal(500, 0.6, 32768)),
    "summarization": Workload("summarization", LengthDist.lognormal(10000, 0.6, 262144),
                              LengthDist.lognormal(500, 0.5, 32768)),
    "reasoning": Workload("reasoning", LengthDist.lognormal(1000, 0.8, 65536), LengthDist.lognormal(6000, 0.6, 65536)),
    "deepseek": Workload("deepseek", LengthDist.lognormal(3620, 0.9, 131072), LengthDist.lognormal(1000, 0.7, 32768)),
}


def preset(name: str) -> Workload:
    if name not in PRESETS:
        raise PlanInputError(f"unknown workload preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
