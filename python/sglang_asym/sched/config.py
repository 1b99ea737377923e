"""Frozen, validated configuration of the decode worker's step scheduler."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..config import DEFAULT_WINDOW

MAX_DRAFT_TOKENS = 7  # DSpark drafts at most 7 tokens: the verify width 1 + k is at most 8 rows.

# window rows per request and decode-worker step unless --window-chunk-size says otherwise (both runtimes)
DEFAULT_WINDOW_CHUNK = 32


def chunk_rows_for(window: int, window_chunk: int | None) -> int | None:
    """The policy's window_chunk from a window-chunk flag: None (unset) -> min(DEFAULT_WINDOW_CHUNK, W);
    0 -> None (whole windows); c -> c."""
    if window_chunk is None:
        return min(DEFAULT_WINDOW_CHUNK, window)
    return window_chunk or None


class AdmitPolicy(str, Enum):
    """Which waiting requests a step admits."""

    BUDGET = "budget"  # FIFO prefix under the token budget and the window-row bound, with aging
    ADMIT_ALL = "admit_all"  # everything that has a running slot, in one step (benchmark baseline)


def _check_int(owner: str, name: str, value: object, minimum: int) -> None:
    # bool is an int subclass; a True budget is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value}")


def _coerce_enum(owner: str, name: str, enum_type: type[Enum], value: object) -> Enum:
    try:
        return enum_type(value)
    except ValueError:
        allowed = [m.value for m in enum_type]
        raise ValueError(f"{owner}.{name} must be one of {allowed}, got {value!r}") from None


@dataclass(frozen=True)
class SchedulerConfig:
    """Decode-worker step policy. Rows are tokens run through the model in one step (all its forwards)."""

    token_budget: int = 1024  # decode rows + window rows per step (actual rows, before graph padding)
    max_window_rows_per_step: int = 512  # window rows per step, never exceeded
    max_running: int = 64  # running decode requests, including those admitted this step
    num_draft_tokens: int = 3  # k: a running request verifies 1 + k rows per step
    window: int = DEFAULT_WINDOW  # W: the most prompt rows a new request runs on the decode worker
    policy: AdmitPolicy = AdmitPolicy.BUDGET
    # Aging: a queue head that has waited this many steps is admitted even over the token budget.
    max_wait_steps: int = 8
    max_waiting: int = 1024  # queue capacity; bounds how long the last request can wait
    # Chunked windows: None runs every window whole in one step. An int c runs a window over several
    # steps, at most c rows per step, each chunk sized to the token budget left beside the decode rows
    # (the head of the queue finishes its window before the next request starts); a step then never
    # exceeds the token budget and needs no aging (see plan.py). The admit_all policy runs whole windows.
    window_chunk: int | None = None
    # Deterministic inference (--enable-deterministic-inference): chunked windows are cut at fixed
    # multiples of window_chunk from the window's first row, never to the budget left beside the decode
    # rows (a chunk that does not fit waits), so a request's chunks do not depend on the load.
    deterministic: bool = False

    def __post_init__(self) -> None:
        owner = "SchedulerConfig"
        _check_int(owner, "token_budget", self.token_budget, 1)
        _check_int(owner, "max_running", self.max_running, 1)
        _check_int(owner, "num_draft_tokens", self.num_draft_tokens, 0)
        if self.num_draft_tokens > MAX_DRAFT_TOKENS:
            raise ValueError(
                f"{owner}.num_draft_tokens must be <= {MAX_DRAFT_TOKENS} (verify width at most 8), "
                f"got {self.num_draft_tokens}"
            )
        _check_int(owner, "window", self.window, 1)
        _check_int(owner, "max_window_rows_per_step", self.max_window_rows_per_step, 1)
        if self.max_window_rows_per_step < self.window:
            raise ValueError(
                f"{owner}.max_window_rows_per_step ({self.max_window_rows_per_step}) must be >= window "
                f"({self.window}), otherwise a full window could never be admitted"
            )
        full_decode_rows = self.max_running * self.verify_width
        if self.token_budget < full_decode_rows:
            raise ValueError(
                f"{owner}.token_budget ({self.token_budget}) must be >= max_running * (1 + num_draft_tokens) "
                f"= {self.max_running} * {self.verify_width} = {full_decode_rows}, so a full decode batch fits"
            )
        object.__setattr__(self, "policy", _coerce_enum(owner, "policy", AdmitPolicy, self.policy))
        _check_int(owner, "max_wait_steps", self.max_wait_steps, 0)
        if self.window_chunk is not None:
            _check_int(owner, "window_chunk", self.window_chunk, 1)
            if self.window_chunk > self.window:
                raise ValueError(f"{owner}.window_chunk ({self.window_chunk}) must be <= window ({self.window})")
        if not isinstance(self.deterministic, bool):
            raise TypeError(f"{owner}.deterministic must be a bool, got {self.deterministic!r}")
        head_room = self.token_budget - (self.max_running - 1) * self.verify_width
        if self.deterministic and self.window_chunk is not None and head_room < self.window_chunk:
            raise ValueError(
                f"{owner}: deterministic chunked windows need token_budget - (max_running - 1) * (1 + k) = "
                f"{head_room} >= window_chunk ({self.window_chunk}), so the queue head's chunk always fits"
            )
        _check_int(owner, "max_waiting", self.max_waiting, 1)

    @property
    def chunk_rows(self) -> int:
        """The most window rows one request runs in one step."""
        return self.window if self.window_chunk is None else self.window_chunk

    @property
    def verify_width(self) -> int:
        """Rows a running request runs per step: its last token plus k draft tokens."""
        return 1 + self.num_draft_tokens
