"""Inter-token latency of running requests under admission bursts, budget policy vs admit-everything.

The decode worker's real loop (`runtime.engine.decode_loop.DecodeLoop`) on the small config, CPU:
R requests decode steadily; then a burst of new requests (prefix states already transferred)
arrives at once. Measured in ONE run for both policies, side by side: p50/p99 ITL of the running
requests in the steady phase and in the burst phase, and TTFT of the burst requests.
Every step is one batched forward over all its requests' rows. The budget policy runs each window in
chunks of at most --window-chunk rows, sized to the token budget (running + chunk) left beside the
decode rows, one request's window after the other; admit-all runs every waiting window whole at once.
Besides wall-clock ITL the JSON holds each step's process CPU time (p50/p99, steady vs burst steps):
on a machine shared with other work the CPU ratio shows the policy's own cost.
Writes decode_itl.json and decode_itl.png into --out-dir (default benchmark/results).

    .venv/bin/python benchmark/decode_itl.py [--running 16] [--burst 8] [--prompt-len 256] [--window-chunk 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from sglang_asym.asym import run_prefix
from sglang_asym.cache import CacheSizing
from sglang_asym.config import V41Config
from sglang_asym.runtime.engine.decode_loop import ActiveRequest, DecodeLoop
from sglang_asym.runtime.engine_api import SamplingParams
from sglang_asym.sched import SchedulerConfig
from sglang_asym.split import SplitPlan
from sglang_asym.verify import Models, random_prompt

RESULTS = Path(__file__).resolve().parent / "results"
RUNNING_TOKENS = 4000  # token limit of the running requests (never reached in a run)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


class Recorder:
    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.expected_finish: set[str] = set()

    def emitter(self, rid: str):
        def emit(event) -> None:
            with self.lock:
                self.times.setdefault(rid, []).extend([time.perf_counter()] * max(1, len(event.new_token_ids)))
                if event.finished:
                    self.expected_finish.discard(rid)
                    if not self.expected_finish:
                        self.done.set()
        return emit


def run_policy(models: Models, policy: str, args, prefixes) -> dict:
    cfg = models.full.cfg
    total = args.running + args.burst
    chunk = args.window_chunk if policy == "budget" else None  # admit-all: whole windows
    sched = SchedulerConfig(token_budget=args.running + (args.window_chunk if policy == "budget" else 128),
                            max_window_rows_per_step=128, max_running=total, num_draft_tokens=0, window=128,
                            mode="mixed", policy=policy, window_chunk=chunk)
    steps, clocks = [], []  # StepRecords; (wall, process CPU) when each step ended

    def on_step(record) -> None:
        clocks.append((time.perf_counter(), time.process_time()))
        steps.append(record)

    # Running requests decode until the run ends: with chunked windows the start-up alone takes
    # running * ceil(128 / chunk) steps, so their token limit (and cache) leaves room for far more.
    sizing = CacheSizing(total + 1, args.prompt_len + RUNNING_TOKENS + 8, max_chunk_tokens=128)
    loop = DecodeLoop(models.full, models.full.new_cache_set(sizing), sched, cfg.eos_token_id, on_step=on_step)
    rec = Recorder()
    loop.start()
    # running requests decode until the loop is stopped; the run ends once the burst is served
    long_params = SamplingParams(max_new_tokens=RUNNING_TOKENS, temperature=0, ignore_eos=True)
    burst_params = SamplingParams(max_new_tokens=2, temperature=0, ignore_eos=True)
    rec.expected_finish = {f"new{j}" for j in range(args.burst)}
    for i in range(args.running):
        prompt, split, state = prefixes[i]
        loop.submit(ActiveRequest(f"run{i}", prompt, split, state, long_params, rec.emitter(f"run{i}")))
    # steady state: every running request admitted, then steady_steps more tokens each
    while min((len(rec.times.get(f"run{i}", [])) for i in range(args.running)), default=0) < 1:
        time.sleep(0.01)
    with rec.lock:
        all_running_at = max(rec.times[f"run{i}"][0] for i in range(args.running))
        start_counts = [len(rec.times[f"run{i}"]) for i in range(args.running)]
    while min(len(rec.times[f"run{i}"]) - start_counts[i] for i in range(args.running)) < args.steady_steps:
        time.sleep(0.01)
    burst_at = time.perf_counter()
    for j in range(args.burst):
        prompt, split, state = prefixes[args.running + j]
        loop.submit(ActiveRequest(f"new{j}", prompt, split, state, burst_params, rec.emitter(f"new{j}"),
                                  arrival=time.monotonic()))
    rec.done.wait(timeout=3600)
    tail_from = len(rec.times["run0"])
    while len(rec.times["run0"]) < tail_from + args.tail_steps:
        time.sleep(0.01)
    loop.stop()
    # steady: intervals that ended before the burst; burst: intervals overlapping the admissions
    admissions_end = max(rec.times[f"new{j}"][0] for j in range(args.burst))
    steady_itl, burst_itl = [], []
    for i in range(args.running):
        ts = rec.times[f"run{i}"]
        for a, b in zip(ts, ts[1:]):
            if a < all_running_at:
                continue  # start-up: the running batch itself was still being admitted
            if b <= burst_at:
                steady_itl.append(b - a)
            elif a < admissions_end:
                burst_itl.append(b - a)
    ttft = [rec.times[f"new{j}"][0] - burst_at for j in range(args.burst)]
    # process CPU per step (the loop is the only busy thread), classified like the ITL intervals: steps
    # that ran in the steady phase vs steps that overlapped the admission of the burst
    cpu_steady, cpu_burst = [], []
    for (end, cpu), (start, cpu_before) in zip(clocks[1:], clocks):
        if start >= all_running_at and end <= burst_at:
            cpu_steady.append(cpu - cpu_before)
        elif end > burst_at and start < admissions_end:
            cpu_burst.append(cpu - cpu_before)
    return {
        "policy": policy, "window_chunk": chunk, "token_budget": sched.token_budget,
        "steady_p50_ms": 1000 * percentile(steady_itl, 50), "steady_p99_ms": 1000 * percentile(steady_itl, 99),
        "burst_p50_ms": 1000 * percentile(burst_itl, 50), "burst_p99_ms": 1000 * percentile(burst_itl, 99),
        "ttft_mean_ms": 1000 * statistics.mean(ttft), "ttft_max_ms": 1000 * max(ttft),
        "step_cpu_ms": {"steady_p50": 1000 * percentile(cpu_steady, 50), "steady_p99": 1000 * percentile(cpu_steady, 99),
                        "burst_p50": 1000 * percentile(cpu_burst, 50), "burst_p99": 1000 * percentile(cpu_burst, 99),
                        "steady_steps": len(cpu_steady), "burst_steps": len(cpu_burst)},
        "steps": [{"shape": s.shape, "decode_rows": s.decode_rows, "window_rows": s.window_rows,
                   "seconds": round(s.seconds, 4)} for s in steps],
        "counters": str(loop.scheduler.counters),
        "itl_series": {f"run{i}": [round(b - a, 4) for a, b in zip(rec.times[f"run{i}"], rec.times[f"run{i}"][1:])]
                       for i in range(args.running)},
        "burst_at_s": burst_at,
        "steady_intervals": len(steady_itl), "burst_intervals": len(burst_itl),
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), sharey=True)
    for ax, r in zip(axes, results):
        for rid, series in r["itl_series"].items():
            ax.plot(range(1, len(series) + 1), [1000 * s for s in series], lw=0.8, alpha=0.7)
        ax.axhline(1.5 * r["steady_p99_ms"], color="k", ls="--", lw=1, label="1.5 x steady p99")
        ax.set_title(f"{r['policy']}: burst p99 {r['burst_p99_ms']:.0f} ms, TTFT max {r['ttft_max_ms']:.0f} ms")
        ax.set_xlabel("token index of a running request")
        ax.legend()
    axes[0].set_ylabel("inter-token latency (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--running", type=int, default=16)
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steady-steps", type=int, default=6)
    parser.add_argument("--tail-steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (the small model's ops are too small to gain from more)")
    parser.add_argument("--window-chunk", type=int, default=8,
                        help="budget policy: window rows per step and request (admit-all runs whole windows)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where the JSON and the PNG go")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = Models.build(V41Config.small(), args.seed, cache_quant="release")
    cfg = models.full.cfg
    prefixes = []
    p_caches = models.prefill.new_cache_set(CacheSizing(1, args.prompt_len + 8))
    for i in range(args.running + args.burst):
        prompt = random_prompt(cfg, args.prompt_len, seed=args.seed * 1000 + i)
        split = SplitPlan(cfg, args.prompt_len, 128, "asym-exact-encoder")
        prefixes.append((prompt, split, run_prefix(models.prefill, p_caches, prompt, split)))
    results = [run_policy(models, policy, args, prefixes) for policy in ("budget", "admit_all")]
    budget, admit_all = results
    out = {
        "command": "python " + " ".join(sys.argv),
        "config": "small", "device": "cpu", "running": args.running, "burst": args.burst,
        "prompt_len": args.prompt_len, "window_rows_per_request": 128,
        "steady_p99_ms": budget["steady_p99_ms"],
        "steady_p99_ms_admit_all_run": admit_all["steady_p99_ms"],
        "burst_p99_ms_policy": budget["burst_p99_ms"],
        "burst_p99_ms_admit_all": admit_all["burst_p99_ms"],
        "policy_ratio_vs_steady": budget["burst_p99_ms"] / budget["steady_p99_ms"],
        "admit_all_ratio_vs_steady": admit_all["burst_p99_ms"] / admit_all["steady_p99_ms"],
        "goal_policy_within_1_5x": budget["burst_p99_ms"] <= 1.5 * budget["steady_p99_ms"],
        "goal_admit_all_exceeds": admit_all["burst_p99_ms"] > 1.5 * admit_all["steady_p99_ms"],
        "ttft_price_ms": {"policy_mean": budget["ttft_mean_ms"], "policy_max": budget["ttft_max_ms"],
                          "admit_all_mean": admit_all["ttft_mean_ms"], "admit_all_max": admit_all["ttft_max_ms"]},
        "step_cpu_p99_ratio_burst_vs_steady": {
            r["policy"]: r["step_cpu_ms"]["burst_p99"] / r["step_cpu_ms"]["steady_p99"] for r in results},
        "policies": [{k: v for k, v in r.items() if k not in ("itl_series",)} for r in results],
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "decode_itl.json").write_text(json.dumps(out, indent=1))
    plot(results, args.out_dir / "decode_itl.png")
    print(json.dumps({k: v for k, v in out.items() if k != "policies"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
