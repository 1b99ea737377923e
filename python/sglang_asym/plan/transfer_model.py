"""Bytes on the wire per request for each serving mode (the project's SplitPlan manifests), and transfer time.

  asym        SplitPlan(N).manifest("release"): compressed rows and index keys of [0, N - W), compressor tails,
              the encoder's last 127 window rows (asym-exact-encoder)
  rfc57738    P encodes the whole prompt: the same groups for [0, N) (a split whose boundary is N)
  symmetric   SplitPlan(N).symmetric_manifest(): every token's global rows and every layer's window rows (the
              same bytes whether P ran bounded replay, SGLang's GPU default, or the full-compute baseline)
  colocated   nothing crosses

Transfer of a prefill's rows overlaps its compute (each chunk's rows go out while the next is computed), so
the exposed part is a fixed per-request latency plus the last chunk's bytes, unless the link is slower than
the compute, in which case the whole payload's wire time shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from ..config import DEFAULT_WINDOW, V41Config
from ..layer_plan import LayerPlan
from ..split import SplitPlan
from .errors import PlanInputError

WINDOW = DEFAULT_WINDOW


class Mode(str, Enum):
    COLOCATED = "colocated"
    SYMMETRIC = "symmetric"  # SGLang's default symmetric PD: P runs bounded replay (Role.SYM_P)
    SYMMETRIC_FULL = "symmetric-full-compute"  # baseline only: P runs all layers on every row (Role.FULL)
    ASYM = "asym"
    RFC57738 = "rfc57738"

    @classmethod
    def parse(cls, value: "str | Mode") -> "Mode":
        try:
            return cls(value)
        except ValueError:
            raise PlanInputError(f"unknown mode {value!r}; choose one of {[m.value for m in cls]}") from None


@lru_cache(maxsize=4)
def layer_plan_of(cfg: V41Config) -> LayerPlan:
    return LayerPlan.from_config(cfg)


def _split(cfg: V41Config, prompt_len: int) -> SplitPlan:
    split = SplitPlan(cfg, prompt_len, WINDOW)
    split.__dict__["plan"] = layer_plan_of(cfg)  # seed the cached_property: building a LayerPlan takes ~0.2 s
    return split


@lru_cache(maxsize=65536)
def payload_bytes(mode: Mode, prompt_len: int, cfg: V41Config = V41Config()) -> int:
    """Bytes P ships to D for one prompt of `prompt_len` tokens, at the release's row formats."""
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or prompt_len < 1:
        raise PlanInputError(f"prompt length must be an int >= 1, got {prompt_len!r}")
    mode = Mode.parse(mode)
    if mode is Mode.COLOCATED:
        return 0
    if mode in (Mode.SYMMETRIC, Mode.SYMMETRIC_FULL):
        return _split(cfg, prompt_len).symmetric_manifest().total_bytes
    if mode is Mode.ASYM:
        return _split(cfg, prompt_len).manifest("release").total_bytes
    # boundary = N: all of [0, N); at the very end of the context the split is capped (its last W tokens uncounted)
    return _split(cfg, min(prompt_len + WINDOW, cfg.max_position_embeddings)).manifest("release").total_bytes


@dataclass(frozen=True)
class Link:
    """The path KV takes from P to D: bandwidth per direction and a fixed cost per request (handshake, control)."""

    name: str
    bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0 or self.latency_s < 0:
            raise PlanInputError(f"link {self.name!r} needs bytes_per_s > 0 and latency_s >= 0")

    def wire_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


def exposed_transfer_s(link: Link, nbytes: float, compute_s: float, last_chunk_share: float) -> float:
    """Seconds from the end of P's compute until D holds the payload: the last chunk's rows plus the latency,
    or the whole wire time less the compute it overlapped, whichever is longer."""
    if not 0 <= last_chunk_share <= 1:
        raise PlanInputError(f"last_chunk_share must be in [0, 1], got {last_chunk_share}")
    tail = link.wire_s(nbytes * last_chunk_share)
    whole = link.wire_s(nbytes) - compute_s
    return max(tail, whole, 0.0)
