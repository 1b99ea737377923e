"""The asymmetric role a SGLang server runs, kept beside SGLang's own prefill/decode mode.

SGLang's `DisaggregationMode` is closed (null / prefill / decode) and its scheduler compares it in
many places, so `--disaggregation-mode asym-prefill|asym-decode` is translated to `prefill|decode`
while parsing and the asymmetric role travels as `AsymSettings` on the ServerArgs record. SGLang
pickles ServerArgs with its bookkeeping attributes (`ServerArgs.__reduce__`) into every scheduler,
detokenizer and DP-controller process, so the settings reach them with no environment variable.
This module imports nothing from SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config import DEFAULT_WINDOW
from ...sched.config import chunk_rows_for

TRANSFER_FALLBACKS = ("off", "recompute")  # --asym-transfer-fallback: give up, or recompute the prefix on D

ASYM_PREFILL = "asym-prefill"
ASYM_DECODE = "asym-decode"
ASYM_MODES = (ASYM_PREFILL, ASYM_DECODE)
# --disaggregation-mode value -> the SGLang mode the scheduler runs.
SGLANG_MODE_OF = {ASYM_PREFILL: "prefill", ASYM_DECODE: "decode"}

SEMANTICS_CHOICES = ("asym-exact-encoder", "asym")
DEFAULT_SEMANTICS = "asym-exact-encoder"
DEFAULT_TOKEN_BUDGET = 256  # decode rows + window rows per decode-worker step
DEFAULT_REQUEST_DEADLINE_S = 120.0  # a request's lifetime on each worker of the pair (admission.py)
# On the CPU route a forward is 2-3 orders of magnitude slower: a 4097-token prompt beside other servers on a
# 2-core machine took over 120 s to its last token, so the CPU default leaves room for the longest prompts.
CPU_DEFAULT_REQUEST_DEADLINE_S = 900.0


# Bookkeeping attribute on ServerArgs (underscore names that are not fields stay writable).
SERVER_ARGS_ATTR = "_sglang_asym"


@dataclass(frozen=True)
class AsymSettings:
    """What an asymmetric server is: `mode` as the operator typed it, the window W and semantics."""

    mode: str
    window: int = DEFAULT_WINDOW
    semantics: str = DEFAULT_SEMANTICS
    token_budget: int = DEFAULT_TOKEN_BUDGET
    window_chunk: int | None = None  # window rows per request and step; see chunk_rows_for
    transfer_fallback: str = "off"  # asym-decode: "recompute" computes a failed transfer's prefix on D
    request_deadline_s: float = DEFAULT_REQUEST_DEADLINE_S  # admitted requests end within it, each side

    def __post_init__(self) -> None:
        if self.mode not in ASYM_MODES:
            raise ValueError(f"AsymSettings.mode must be one of {ASYM_MODES}, got {self.mode!r}")
        if type(self.window) is not int or self.window < 1:
            raise ValueError(f"AsymSettings.window must be a positive integer, got {self.window!r}")
        if self.semantics not in SEMANTICS_CHOICES:
            raise ValueError(f"AsymSettings.semantics must be one of {SEMANTICS_CHOICES}, got {self.semantics!r}")
        if type(self.token_budget) is not int or self.token_budget < 1:
            raise ValueError(f"AsymSettings.token_budget must be a positive integer, got {self.token_budget!r}")
        if self.window_chunk is not None and (type(self.window_chunk) is not int
                                              or not 0 <= self.window_chunk <= self.window):
            raise ValueError(f"AsymSettings.window_chunk must be an integer in [0, window={self.window}], "
                             f"got {self.window_chunk!r}")
        if not (isinstance(self.request_deadline_s, (int, float)) and 0 < self.request_deadline_s < float("inf")):
            raise ValueError(f"AsymSettings.request_deadline_s must be a positive number of seconds, "
                             f"got {self.request_deadline_s!r}")
        if self.transfer_fallback not in TRANSFER_FALLBACKS:
            raise ValueError(f"AsymSettings.transfer_fallback must be one of {TRANSFER_FALLBACKS}, "
                             f"got {self.transfer_fallback!r}")
        if self.transfer_fallback != "off" and self.mode != ASYM_DECODE:
            raise ValueError(f"AsymSettings.transfer_fallback {self.transfer_fallback!r} applies to {ASYM_DECODE} "
                             f"only: the prefill role holds no decoder layers")

    @property
    def chunk_rows(self) -> int | None:
        """The policy's window_chunk: rows per request and step, None for whole windows."""
        return chunk_rows_for(self.window, self.window_chunk)

    @property
    def sglang_mode(self) -> str:
        """The SGLang disaggregation mode this role runs as ('prefill' or 'decode')."""
        return SGLANG_MODE_OF[self.mode]

    @property
    def is_prefill(self) -> bool:
        return self.mode == ASYM_PREFILL

    @property
    def recomputes_failed_transfers(self) -> bool:
        return self.transfer_fallback == "recompute"


def attach(server_args: Any, settings: AsymSettings) -> None:
    setattr(server_args, SERVER_ARGS_ATTR, settings)


def settings_of(server_args: Any) -> AsymSettings | None:
    """The asymmetric settings of a ServerArgs record, None for a symmetric server."""
    return getattr(server_args, SERVER_ARGS_ATTR, None)
