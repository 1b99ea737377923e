"""Eager segments vs CUDA-graph replay in the graph runner, per decode bucket (batch x (1 + k)).

Two timings per bucket: the segment chain alone (mHC, norms, MoE, head over the padded rows, no
attention: the launch-bound part a graph removes), and whole decode steps of real requests (the graph
runner replays ONE whole-forward decode graph per step, attention included, after the host fills its
page tables; the eager runner calls the segments with eager paged attention between them), next to the
reference model's own forward over the same requests. Random weights of a preset; the graph columns
need CUDA (on CPU they are null).

    python benchmark/graph_timing.py --preset small --out benchmark/results/gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from sglang_asym.cache import CacheSizing  # noqa: E402
from sglang_asym.checkpoint.random_init import random_weights  # noqa: E402
from sglang_asym.config import V41Config  # noqa: E402
from sglang_asym.model import V41Model  # noqa: E402
from sglang_asym.model.graph_runner import GraphRunner, StepRows  # noqa: E402
from sglang_asym.sched import ForwardKind, GraphChoice, GraphConfig, GraphKind, SchedulerConfig  # noqa: E402


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, iters: int, device: torch.device) -> float:
    times = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def build_model(preset: str, dtype: str | None, device: torch.device) -> V41Model:
    cfg = V41Config.preset(preset)
    model = V41Model(cfg, dtype=dtype, device=device)
    model.load_weights({k: v for k, v in random_weights(cfg, 0).items() if k in model.expected_tensor_names()})
    return model


def reference_step(model: V41Model):
    """The reference forward over a step's requests: batched if the model has it, else one by one."""
    try:
        from sglang_asym.model.model import SegmentInput
    except ImportError:
        return "forward per request", lambda caches, tokens: [model(t, c, logits="all") for c, t in zip(caches, tokens)]
    return "forward_batch", lambda caches, tokens: model.forward_batch(
        [SegmentInput(t, c, "all") for c, t in zip(caches, tokens)])


def time_segments(runners: dict, batch: int, width: int, iters: int, device: torch.device) -> dict:
    choice = GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 1, 1, (batch, width))
    row = {"batch": batch, "width": width, "rows": batch * width}
    for name, runner in runners.items():
        runner.prepare(choice, batch * width)  # a graph runner captures here
        row[f"{name}_ms"] = round(median_ms(lambda: runner.prepare(choice, batch * width), iters, device), 3)
    if "graph_ms" in row:
        row["speedup"] = round(row["eager_ms"] / row["graph_ms"], 2)
    return row


def time_steps(model: V41Model, runners: dict, batch: int, width: int, prompt_len: int, steps: int,
               device: torch.device) -> dict:
    g = torch.Generator().manual_seed(batch * 131 + width)
    prompts = [torch.randint(0, model.cfg.vocab_size, (prompt_len,), generator=g) for _ in range(batch)]
    step_tokens = [[torch.randint(0, model.cfg.vocab_size, (width,), generator=g) for _ in range(batch)]
                   for _ in range(steps + 1)]
    sizing = CacheSizing(max_requests=batch, max_tokens=prompt_len + (steps + 1) * width + 8,
                         max_chunk_tokens=prompt_len)
    ref_name, ref_fn = reference_step(model)
    runs = {"reference": ref_fn}
    for name, runner in runners.items():
        runs[name] = lambda caches, tokens, runner=runner: runner.run(
            [StepRows(c, t) for c, t in zip(caches, tokens)]).logits
    row = {"batch": batch, "width": width, "prompt_len": prompt_len, "reference": ref_name}
    last_logits = {}
    for name, fn in runs.items():
        cache_set = model.new_cache_set(sizing)
        caches = [cache_set.new_request() for _ in range(batch)]
        for c, p in zip(caches, prompts):
            model(p, c, logits="none")
        fn(caches, step_tokens[0])  # warm-up step (captures on the graph runner)
        times, out = [], None
        for tokens in step_tokens[1:]:
            sync(device)
            t0 = time.perf_counter()
            out = fn(caches, tokens)
            sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
        row[f"{name}_ms"] = round(statistics.median(times), 3)
        last_logits[name] = [o.logits if hasattr(o, "logits") else o for o in out]
        for c in caches:
            c.release()
    if "graph" in last_logits:
        row["max_logit_diff_graph_vs_eager"] = max(
            float((a.float() - b.float()).abs().max()) for a, b in zip(last_logits["graph"], last_logits["eager"]))
        row["speedup_vs_eager"] = round(row["eager_ms"] / row["graph_ms"], 2)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: the preset's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", type=ints, default=ints("1,2,4,8,16,32,64"), help="segment-chain batch buckets")
    ap.add_argument("--widths", type=ints, default=ints("1,4"), help="verify widths 1 + k")
    ap.add_argument("--step-batches", type=ints, default=ints("1,4,16"), help="batches of the whole-step timing")
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmark" / "results" / "graph_timing.json")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.perf_counter()
    model = build_model(args.preset, args.dtype, device)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "preset": args.preset, "dtype": str(model.dtype).replace("torch.", ""),
              "build_seconds": round(time.perf_counter() - t0, 1), "segment_chain": [], "decode_step": []}
    batches = sorted(set(args.batches) | set(args.step_batches))
    for width in args.widths:
        config = SchedulerConfig(num_draft_tokens=width - 1, max_running=max(batches),
                                 token_budget=max(1024, max(batches) * width),
                                 graphs=GraphConfig(decode_batch_sizes=tuple(batches)))
        runners = {"eager": GraphRunner(model, config, backend="eager", moe="static")}  # the graphs' segments
        if device.type == "cuda":
            runners["graph"] = GraphRunner(model, config, backend="cuda_graph")
        for batch in args.batches:
            result["segment_chain"].append(time_segments(runners, batch, width, args.iters, device))
            print(json.dumps(result["segment_chain"][-1]), flush=True)
        for batch in args.step_batches:
            result["decode_step"].append(time_steps(model, runners, batch, width, args.prompt_len, args.steps, device))
            print(json.dumps(result["decode_step"][-1]), flush=True)
        if "graph" in runners:
            result.setdefault("graph_stats", {})[f"width_{width}"] = runners["graph"].stats().as_dict()
    result["total_seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
