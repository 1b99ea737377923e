"""Refuses, at launch, every CUDA setting the asymmetric path does not handle, naming what to change.

On CUDA SGLang's own DeepseekV4Model runs the asymmetric roles (the P cut, prefill/cut_hook.py); these
settings would drive parts of it the roles do not hold or were never built for:
- bounded replay on P: `DecoderReplayTail` would run layers >= the last KV source, which P does not hold;
- a prefill CUDA graph on P: inside a breakable graph the KV sources run as an eager break whose graph
  op reads the layer's query path (stripped on P), and a full graph has never run the cut;
- TP / DP / EP / PP / attention-CP sizes above 1: the registration, the exact payload and the cut
  assume one rank holding every head and expert of the roles' layers;
- an Engram on the last KV source: SGLang asserts it off for the tail-source KV write P makes;
- a speculative algorithm other than DSPARK on D: the window rows ride D's decode forward under
  DSpark's verify only.
Checked on the resolved ServerArgs (after SGLang's resolution, in the processes that publish it), for
device "cuda" only: the CPU engine route has its own checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...config import V41Config
from .settings import AsymSettings
from .validation import AsymArgumentError

CUDA = "cuda"
SPECULATIVE_ALGORITHM = "DSPARK"
PARALLEL_SIZES = (("tp_size", "--tp-size"), ("dp_size", "--dp-size"), ("ep_size", "--ep-size"),
                  ("pp_size", "--pp-size"), ("attn_cp_size", "--attn-cp-size"))
GRAPH_OFF = "disabled"
GRAPH_DEFAULT_ON_CUDA = "breakable"  # SGLang's prefill graph backend when nothing else is said


@dataclass(frozen=True)
class CudaGuard:
    """One setting the asymmetric path refuses on CUDA: `refusal` says what to change, or None."""

    name: str
    refusal: Callable[[Any, AsymSettings, V41Config], str | None]


def prefill_graph_backend(server_args: Any) -> str:
    """The prefill CUDA graph backend this record runs with: the resolved config when present, else
    the flags SGLang resolves it from."""
    config = getattr(server_args, "cuda_graph_config", None)
    if config is not None:
        return str(config.prefill.backend)
    if getattr(server_args, "disable_cuda_graph", False) or getattr(server_args, "disable_prefill_cuda_graph", False):
        return GRAPH_OFF
    return str(getattr(server_args, "cuda_graph_backend_prefill", None) or GRAPH_DEFAULT_ON_CUDA)


def _bounded_replay_on_prefill(server_args: Any, settings: AsymSettings, cfg: V41Config) -> str | None:
    # None is SGLang's "auto", which resolves on for both PD roles on CUDA
    if settings.is_prefill and server_args.enable_decoder_swa_bounded_replay is not False:
        return ("decoder SWA bounded replay is on for the asym-prefill server (SGLang's default on CUDA): it would "
                f"run layers >= {cfg.last_kv_source}, which this role does not hold; pass "
                "--no-enable-decoder-swa-bounded-replay")
    return None


def _prefill_graph_on_prefill(server_args: Any, settings: AsymSettings, cfg: V41Config) -> str | None:
    backend = prefill_graph_backend(server_args)
    if settings.is_prefill and backend != GRAPH_OFF:
        return (f"the asym-prefill server runs its prefill CUDA graph as {backend!r}, which has not run the "
                "prefill cut (a breakable graph's KV-source break reads the stripped query path); pass "
                "--cuda-graph-backend-prefill disabled")
    return None


def _parallel_sizes(server_args: Any, settings: AsymSettings, cfg: V41Config) -> str | None:
    given = [f"{flag} {getattr(server_args, field)}" for field, flag in PARALLEL_SIZES
             if int(getattr(server_args, field, 1) or 1) > 1]
    if given:
        return (f"{', '.join(given)}: the {settings.mode} server runs on one GPU (one rank holds every head and "
                "expert its role computes); set these to 1 and scale out with more servers behind the router")
    return None


def _engram_on_last_source(server_args: Any, settings: AsymSettings, cfg: V41Config) -> str | None:
    if cfg.last_kv_source in cfg.engram_layer_ids:
        return (f"the checkpoint puts an Engram on layer {cfg.last_kv_source}, its last KV source: SGLang's "
                "tail-source KV write (the prefill cut) does not run an Engram; serve it with a symmetric server")
    return None


def _speculation_on_decode(server_args: Any, settings: AsymSettings, cfg: V41Config) -> str | None:
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if not settings.is_prefill and algorithm and str(algorithm).upper() != SPECULATIVE_ALGORITHM:
        return (f"--speculative-algorithm {algorithm}: the asym-decode server speculates with "
                f"{SPECULATIVE_ALGORITHM} only; pass --speculative-algorithm {SPECULATIVE_ALGORITHM} or none")
    return None


GUARDS = (
    CudaGuard("bounded replay on P", _bounded_replay_on_prefill),
    CudaGuard("prefill CUDA graph on P", _prefill_graph_on_prefill),
    CudaGuard("parallel sizes", _parallel_sizes),
    CudaGuard("Engram on the last KV source", _engram_on_last_source),
    CudaGuard("speculation other than DSPARK on D", _speculation_on_decode),
)


def cuda_refusals(server_args: Any, settings: AsymSettings, cfg: V41Config) -> list[str]:
    """Every guard's refusal for this record, in GUARDS order; [] off CUDA."""
    if str(getattr(server_args, "device", None)) != CUDA:
        return []
    return [message for guard in GUARDS if (message := guard.refusal(server_args, settings, cfg)) is not None]


def refuse_unhandled_cuda_settings(server_args: Any, settings: AsymSettings) -> None:
    """Raises AsymArgumentError listing every refusal (device "cuda" only)."""
    if str(getattr(server_args, "device", None)) != CUDA:
        return
    refusals = cuda_refusals(server_args, settings, V41Config.from_json_file(server_args.model_path))
    if refusals:
        raise AsymArgumentError(f"--disaggregation-mode {settings.mode} on CUDA cannot run with:"
                                + "".join(f"\n  - {refusal}" for refusal in refusals))
