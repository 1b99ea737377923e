"""EngineOptions: what every embedded engine is configured with (from the launch CLI's flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config import DEFAULT_WINDOW
from ...formats import CACHE_QUANT_MODES
from ...sched import SchedulerConfig
from ...split import Semantics


# exact: the full prompt forward (colocated, and symmetric PD which can only compute that).
SERVED_SEMANTICS = (Semantics.ASYM_EXACT_ENCODER, Semantics.ASYM, Semantics.EXACT)
DEFAULT_SEMANTICS = {"null": Semantics.ASYM_EXACT_ENCODER, "asym-prefill": Semantics.ASYM_EXACT_ENCODER,
                     "asym-decode": Semantics.ASYM_EXACT_ENCODER, "prefill": Semantics.EXACT,
                     "decode": Semantics.EXACT}


# The decode loop's model runner backends (`model.graph_runner.Backend`, plus 'auto': CUDA graphs on a
# CUDA model, else eager).
GRAPH_BACKENDS = ("auto", "eager", "cuda_graph", "emulated_graph")

# What an asym-decode request gets when its prefix transfer fails or times out: off (an error) or
# recompute (D computes the prefix itself with its full model, as the colocated engine does).
TRANSFER_FALLBACKS = ("off", "recompute")


def check_mode_semantics(mode: str, semantics: Semantics | str) -> Semantics:
    """The semantics a --disaggregation-mode can serve; ValueError with the reason otherwise."""
    semantics = Semantics.parse(semantics)
    if mode not in DEFAULT_SEMANTICS:
        raise ValueError(f"unknown --disaggregation-mode {mode!r}; choose one of {sorted(DEFAULT_SEMANTICS)}")
    if semantics not in SERVED_SEMANTICS:
        raise ValueError(f"--asym-semantics {semantics.value} is not served; choose one of "
                         f"{[s.value for s in SERVED_SEMANTICS]}")
    if mode.startswith("asym-") and semantics is Semantics.EXACT:
        raise ValueError(f"--asym-semantics exact cannot be split: {mode} serves asym-exact-encoder or asym "
                         "(symmetric PD, --disaggregation-mode prefill / decode, computes exact)")
    if mode in ("prefill", "decode") and semantics is not Semantics.EXACT:
        raise ValueError(f"symmetric PD (--disaggregation-mode {mode}) computes the exact full prefill; "
                         f"--asym-semantics {semantics.value} does not apply to it (use exact)")
    return semantics


@dataclass(frozen=True)
class EngineOptions:
    model_path: str
    window: int = DEFAULT_WINDOW  # --asym-window
    semantics: Semantics = Semantics.ASYM_EXACT_ENCODER  # --asym-semantics
    cache_quant: str = "release"  # --cache-quant: the release's cache formats are part of the model
    max_running: int = 8
    max_total_tokens: int = 8192  # per-request cache capacity (prompt + generated)
    page_rows: int = 64
    prefill_chunk: int = 1024  # the prefill role computes and ships the prefix in chunks of this many tokens
    # Decode worker: overrides scheduler.window_chunk when set (None: the scheduler's own setting, which the
    # launch CLI sets from --window-chunk-size).
    window_chunk: int | None = None
    transfer_timeout_s: float = 30.0  # a prefix that has not arrived by then fails the request
    bootstrap_port: int | None = None  # prefill role: where its bootstrap server listens
    graph_backend: str = "auto"  # --graph-backend: how the decode loop's runner executes each graph shape
    # --enable-deterministic-inference: every forward runs one request (model.deterministic) and windows
    # run in fixed chunks, so a request's tokens do not depend on what else is served (costs batching)
    deterministic: bool = False
    transfer_fallback: str = "off"  # --transfer-fallback (asym-decode): one of TRANSFER_FALLBACKS
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(
        token_budget=256, max_window_rows_per_step=256, max_running=8, num_draft_tokens=0))

    def __post_init__(self) -> None:
        object.__setattr__(self, "semantics", Semantics.parse(self.semantics))
        if self.semantics not in SERVED_SEMANTICS:
            raise ValueError(f"--asym-semantics must be one of {[s.value for s in SERVED_SEMANTICS]}, "
                             f"got {self.semantics.value!r}")
        if self.window < 1:
            raise ValueError(f"--asym-window must be >= 1, got {self.window}")
        if self.cache_quant not in CACHE_QUANT_MODES:
            raise ValueError(f"--cache-quant must be one of {list(CACHE_QUANT_MODES)}, got {self.cache_quant!r}")
        if self.max_running < 1 or self.max_total_tokens < 2 or self.prefill_chunk < 1:
            raise ValueError("max_running, max_total_tokens and prefill_chunk must be positive")
        if self.graph_backend not in GRAPH_BACKENDS:
            raise ValueError(f"--graph-backend must be one of {list(GRAPH_BACKENDS)}, got {self.graph_backend!r}")
        if self.transfer_fallback not in TRANSFER_FALLBACKS:
            raise ValueError(f"--transfer-fallback must be one of {list(TRANSFER_FALLBACKS)}, "
                             f"got {self.transfer_fallback!r}")
        if self.transfer_timeout_s <= 0:
            raise ValueError(f"transfer timeout must be > 0, got {self.transfer_timeout_s}")
