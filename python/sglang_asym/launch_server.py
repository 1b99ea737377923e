"""`python -m sglang_asym.launch_server`: the embedded runtime's server, with SGLang's flag names.

  --disaggregation-mode null          the full model in one process (reference, baseline)
  --disaggregation-mode asym-prefill  encoder + last KV source's path; computes [0, N-W), ships the prefix
  --disaggregation-mode asym-decode   the full model; runs [N-W, N) over the prefix, then decodes
  --disaggregation-mode prefill|decode  symmetric PD as SGLang does it today (the baseline to beat)

The same flags are accepted by `python -m sglang.launch_server` through the SGLang plugin, which
hands CPU runs (and anything SGLang's own engine cannot serve) to this module."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .checkpoint import CheckpointError
from .config import DEFAULT_WINDOW, ConfigError
from .formats import CACHE_QUANT_MODES
from .sched import MAX_DRAFT_TOKENS, SchedulerConfig
from .sched.config import DEFAULT_WINDOW_CHUNK, chunk_rows_for
from .split import Semantics
from .runtime.engine.options import TRANSFER_FALLBACKS

MODES = ("null", "asym-prefill", "asym-decode", "prefill", "decode")
logger = logging.getLogger("sglang_asym.launch_server")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_asym.launch_server", description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", choices=MODES, default="null")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--disaggregation-transfer-backend", choices=["mooncake"], default="mooncake")
    p.add_argument("--disaggregation-ib-device", default=None, help="accepted for SGLang compatibility (RDMA)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--asym-window", type=int, default=DEFAULT_WINDOW)
    p.add_argument("--asym-semantics", default=None,
                   choices=[Semantics.ASYM_EXACT_ENCODER.value, Semantics.ASYM.value, Semantics.EXACT.value],
                   help="default: asym-exact-encoder (null, asym-*), exact (prefill / decode: symmetric PD "
                        "computes only that); exact on null is the full prompt forward, symmetric PD's reference")
    p.add_argument("--cache-quant", choices=list(CACHE_QUANT_MODES), default="release",
                   help="cache formats: release (V4.1's own), v4 (SGLang's V4 pool layout, as on an H200), "
                        "none (exact float caches)")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=0)
    p.add_argument("--max-running-requests", type=int, default=8)
    p.add_argument("--max-total-tokens", type=int, default=8192, help="per-request context capacity")
    p.add_argument("--chunked-prefill-size", type=int, default=1024)
    p.add_argument("--decode-token-budget", type=int, default=256, help="rows per decode-worker step")
    p.add_argument("--window-chunk-size", type=int, default=None,
                   help="decode worker: at most this many window rows per step and request, each chunk sized "
                        "to the token budget left beside the decode rows, so a step never exceeds "
                        f"--decode-token-budget (default {DEFAULT_WINDOW_CHUNK}: a window step costs about as "
                        "much as a decode step of that many rows, so running requests keep their pace while a new "
                        "request's window runs over a few steps); 0 runs every window whole in one step, "
                        "admitting an aged queue head over the budget")
    p.add_argument("--schedule-mode", choices=["mixed", "separate"], default="mixed")
    p.add_argument("--admission-policy", choices=["budget", "admit_all"], default="budget")
    p.add_argument("--graph-backend", choices=["auto", "eager", "emulated_graph"], default="auto",
                   help="decode worker's model runner: auto (eager on CPU), eager, or emulated_graph (the graph "
                        "path's static buffers replayed on CPU: a check of the CUDA-graph plumbing)")
    p.add_argument("--enable-deterministic-inference", action="store_true",
                   help="a request's tokens do not depend on the batch it shares: every forward runs one "
                        "request and windows run in fixed chunks of --window-chunk-size (slower under load; "
                        "off by default)")
    p.add_argument("--transfer-timeout", type=float, default=30.0,
                   help="seconds a decode request waits for its prefill worker to start the transfer")
    p.add_argument("--transfer-fallback", choices=list(TRANSFER_FALLBACKS), default="off",
                   help="asym-decode: what a request whose prefix transfer fails or times out gets. off: an "
                        "error; recompute: the decode worker (it holds the full model) computes the whole "
                        "prompt itself, one such prefix at a time (logged and counted on /metrics)")
    p.add_argument("--log-level", default="info")
    return p


def validate(args: argparse.Namespace) -> None:
    if args.device == "cuda":
        raise SystemExit("error: the embedded runtime runs on --device cpu; CUDA serving goes through "
                         "`python -m sglang.launch_server` with the sglang-asym plugin")
    if args.speculative_num_draft_tokens < 0:
        raise SystemExit(f"error: --speculative-num-draft-tokens must be >= 0 (0 turns speculative decoding off), "
                         f"got {args.speculative_num_draft_tokens}")
    if args.asym_window < 1 or args.max_running_requests < 1 or args.max_total_tokens < 2:
        raise SystemExit("error: --asym-window, --max-running-requests and --max-total-tokens must be positive")
    if args.window_chunk_size is not None and not 0 <= args.window_chunk_size <= args.asym_window:
        raise SystemExit(f"error: --window-chunk-size must be in [0, --asym-window={args.asym_window}] (0 runs "
                         f"every window whole in one step), got {args.window_chunk_size}")
    if args.transfer_fallback != "off" and args.disaggregation_mode != "asym-decode":
        raise SystemExit(f"error: --transfer-fallback {args.transfer_fallback} applies to --disaggregation-mode "
                         f"asym-decode only (the worker that receives prefixes), got {args.disaggregation_mode}")
    from .runtime.engine.options import DEFAULT_SEMANTICS, check_mode_semantics

    if args.asym_semantics is None:
        args.asym_semantics = DEFAULT_SEMANTICS[args.disaggregation_mode].value
    try:
        check_mode_semantics(args.disaggregation_mode, args.asym_semantics)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if not Path(args.model_path).is_dir():
        raise SystemExit(f"error: --model-path {args.model_path} is not a checkpoint directory")
    if args.speculative_num_draft_tokens:
        validate_draft_tokens(args.model_path, args.speculative_num_draft_tokens)
    if args.enable_deterministic_inference:
        try:  # fixed window chunks need room for the queue head's whole chunk
            engine_options(args)
        except ValueError as exc:
            raise SystemExit(f"error: --enable-deterministic-inference: {exc}") from None


def validate_draft_tokens(model_path: str, k: int) -> None:
    """k draft tokens per step need the checkpoint's DSpark drafter (its mtp.* weights), k <= its block."""
    from .checkpoint import read_checkpoint_config
    from .speculative import max_draft_tokens, missing_drafter_tensors

    try:
        cfg = read_checkpoint_config(Path(model_path))
        missing = missing_drafter_tensors(model_path)
    except (CheckpointError, ConfigError) as exc:
        raise SystemExit(f"error: {exc}") from None
    limit = min(max_draft_tokens(cfg.dspark_block_size), MAX_DRAFT_TOKENS)
    if k > limit:
        raise SystemExit(f"error: --speculative-num-draft-tokens must be in [0, {limit}] for this checkpoint (its "
                         f"DSpark drafter proposes at most dspark_block_size={cfg.dspark_block_size} tokens a step; "
                         f"0 turns speculative decoding off), got {k}")
    if missing:
        raise SystemExit(f"error: --speculative-num-draft-tokens {k} needs the DSpark drafter, but {model_path} has no "
                         f"drafter weights: {len(missing)} mtp.* tensor(s) missing, e.g. {missing[:3]} "
                         "(use --speculative-num-draft-tokens 0)")


def window_chunk(args: argparse.Namespace) -> int | None:
    """SchedulerConfig.window_chunk for --window-chunk-size: unset -> DEFAULT_WINDOW_CHUNK (at most the
    window), 0 -> None (whole windows), c -> c; each chunk is also cut to the budget left."""
    return chunk_rows_for(args.asym_window, args.window_chunk_size)


def engine_options(args: argparse.Namespace):
    from .runtime.engine.options import EngineOptions

    k = args.speculative_num_draft_tokens
    budget = max(args.decode_token_budget, args.max_running_requests * (1 + k), args.asym_window)
    sched = SchedulerConfig(token_budget=budget, max_window_rows_per_step=max(budget, args.asym_window),
                            max_running=args.max_running_requests, num_draft_tokens=k, window=args.asym_window,
                            mode=args.schedule_mode, policy=args.admission_policy, window_chunk=window_chunk(args),
                            deterministic=args.enable_deterministic_inference)
    return EngineOptions(model_path=args.model_path, window=args.asym_window, semantics=args.asym_semantics,
                         cache_quant=args.cache_quant, max_running=args.max_running_requests,
                         max_total_tokens=args.max_total_tokens, prefill_chunk=args.chunked_prefill_size,
                         transfer_timeout_s=args.transfer_timeout, graph_backend=args.graph_backend,
                         bootstrap_port=args.disaggregation_bootstrap_port, scheduler=sched,
                         deterministic=args.enable_deterministic_inference,
                         transfer_fallback=args.transfer_fallback)


def build_engine(args: argparse.Namespace):
    from .model.loading import model_from_checkpoint
    from .runtime.engine.colocated import ColocatedEngine

    options = engine_options(args)
    mode = args.disaggregation_mode
    if mode == "null":
        return ColocatedEngine(model_from_checkpoint(args.model_path, cache_quant=args.cache_quant, progress=True),
                               options)
    from .runtime.engine import disaggregated

    return disaggregated.build(mode, args.model_path, options, host=args.host)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    validate(args)
    from .runtime.http import HttpServerConfig, TextTokenizer, run_http_server

    try:
        engine = build_engine(args)
    except (CheckpointError, ConfigError) as exc:
        raise SystemExit(f"error: {exc}") from None
    config = HttpServerConfig(model_path=args.model_path, tokenizer_path=args.tokenizer_path,
                              served_model_name=args.served_model_name, host=args.host, port=args.port)
    logger.info("serving %s (%s) on http://%s:%d", args.model_path, args.disaggregation_mode, args.host, args.port)
    try:
        run_http_server(engine, TextTokenizer.from_dir(config.tokenizer_dir), config)
    finally:
        shutdown = getattr(engine, "shutdown", None)
        if shutdown is not None:
            shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
