"""Serving benchmark: a request-rate sweep through the real router for colocated, symmetric PD and
asymmetric PD on the small checkpoint, plus the prefill compute per request at N = 4096.

Modes (each started, measured and stopped in turn, one torch thread per server by default):
  colocated  one `null` server behind sglang-router in regular mode
  symmetric  `prefill` + `decode` behind sglang-router in PD mode (SGLang's PD today: P runs everything)
  asym       `asym-prefill` + `asym-decode` behind sglang-router in PD mode
Per mode and rate (Poisson arrivals, mixed prompt lengths, streaming /generate, greedy, ignore_eos):
TTFT p50/p99, ITL p50/p99, output and total throughput (tokens/s), prefill compute seconds per request
(P's `sglang_asym:prefill_compute_seconds`, the colocated server's prefix compute) and payload bytes
per request (P's `sglang_asym:kv_transfer_bytes`), both read from /metrics before and after the rate.
Then, in the same run, requests of N = 4096 tokens one at a time: asym prefill compute per request /
symmetric prefill compute per request (goal <= 0.6). Writes benchmark/results/serving.json and .png.

    .venv/bin/python benchmark/serving.py [--checkpoint DIR] [--rates 0.2,1] [--requests-per-rate 4]
        [--max-new-tokens 8] [--prompt-min 512] [--prompt-max 1024] [--long-n 4096] [--long-repeats 2]
        [--modes colocated,symmetric,asym] [--threads 1] [--quick] [--out benchmark/results]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess, pick_free_port
from sglang_asym.testing.server_process import ServerProcess, start_server, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
MODES = {"colocated": ("null",), "symmetric": ("prefill", "decode"), "asym": ("asym-prefill", "asym-decode")}
COMPUTE_METRIC = "sglang_asym:prefill_compute_seconds"
BYTES_METRIC = "sglang_asym:kv_transfer_bytes"
RATIO_GOAL = 0.6
VOCAB_IDS = (3, 700)  # prompt token ids are drawn from [3, 700): plain bytes of the small tokenizer


# ---- pure parts (tested) -------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = q / 100 * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def latency_summary(seconds: list[float]) -> dict:
    """p50 / p99 / mean in milliseconds, and how many values."""
    ms = [1000 * s for s in seconds]
    return {"count": len(ms), "p50_ms": _round(percentile(ms, 50)), "p99_ms": _round(percentile(ms, 99)),
            "mean_ms": _round(sum(ms) / len(ms)) if ms else float("nan")}


def _round(x: float, digits: int = 2) -> float:
    return x if math.isnan(x) else round(x, digits)


@dataclass
class RequestRecord:
    """One streamed request as the client saw it (perf_counter seconds)."""

    prompt_tokens: int
    sent_at: float
    token_times: list[float] = field(default_factory=list)  # one entry per output token
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent_at if self.token_times else None

    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


def token_times(chunks: list[tuple[float, int]]) -> list[float]:
    """(arrival time, cumulative completion tokens) of each SSE chunk -> one time per token; a chunk
    with k new tokens spreads them evenly over the gap since the previous chunk (as /metrics does)."""
    times, last_time, last_count = [], None, 0
    for t, count in chunks:
        new = count - last_count
        if new <= 0:
            continue
        if last_time is None:
            times += [t] * new
        else:
            step = (t - last_time) / new
            times += [last_time + step * (i + 1) for i in range(new)]
        last_time, last_count = t, count
    return times


def metric_totals(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum every label set of `<name>_sum` and `<name>_count` in a Prometheus exposition."""
    totals = {f"{n}_{suffix}": 0.0 for n in names for suffix in ("sum", "count")}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        if name in totals:
            totals[name] += float(value)
    return totals


def per_request(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """Mean of a histogram over what was observed between two snapshots (None: nothing observed)."""
    count = after[f"{name}_count"] - before[f"{name}_count"]
    return None if count <= 0 else (after[f"{name}_sum"] - before[f"{name}_sum"]) / count


def rate_summary(rate: float, records: list[RequestRecord], before: dict[str, float], after: dict[str, float]
                 ) -> dict:
    ok = [r for r in records if r.error is None and r.token_times]
    ttft = [r.ttft for r in ok]
    itl = [gap for r in ok for gap in r.itl()]
    span = (max(r.token_times[-1] for r in ok) - min(r.sent_at for r in ok)) if ok else float("nan")
    out_tokens = sum(len(r.token_times) for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    compute = per_request(before, after, COMPUTE_METRIC)
    payload = per_request(before, after, BYTES_METRIC)
    return {
        "rate_rps": rate, "requests": len(records), "completed": len(ok),
        "errors": [r.error for r in records if r.error is not None],
        "mean_prompt_tokens": _round(prompt_tokens / len(ok), 1) if ok else float("nan"),
        "ttft": latency_summary(ttft), "itl": latency_summary(itl),
        "output_throughput_tok_s": _round(out_tokens / span, 3) if ok and span > 0 else float("nan"),
        "total_throughput_tok_s": _round((out_tokens + prompt_tokens) / span, 3) if ok and span > 0 else float("nan"),
        "prefill_compute_s_per_request": None if compute is None else round(compute, 4),
        "payload_bytes_per_request": 0 if payload is None else round(payload),
    }


def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    """Send offsets (s) of n requests arriving as a Poisson process of `rate` per second."""
    if rate <= 0 or n < 0:
        raise ValueError(f"rate must be > 0 and n >= 0, got {rate}, {n}")
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def prompt_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(*VOCAB_IDS) for _ in range(n)]


SCHEMA = {
    "top": ("command", "config", "device", "threads_per_server", "settings", "modes", "long_prompt"),
    "rate": ("rate_rps", "requests", "completed", "errors", "mean_prompt_tokens", "ttft", "itl",
             "output_throughput_tok_s", "total_throughput_tok_s", "prefill_compute_s_per_request",
             "payload_bytes_per_request"),
    "latency": ("count", "p50_ms", "p99_ms", "mean_ms"),
    "long": ("n", "repeats", "symmetric_prefill_compute_s", "asym_prefill_compute_s", "asym_over_symmetric",
             "goal", "goal_met", "symmetric_payload_bytes", "asym_payload_bytes"),
}


def check_schema(result: dict) -> None:
    """Raise ValueError naming the first missing key of serving.json's layout."""
    def need(obj: dict, keys, where: str) -> None:
        missing = [k for k in keys if k not in obj]
        if missing:
            raise ValueError(f"{where}: missing {missing}")

    need(result, SCHEMA["top"], "result")
    for mode, entry in result["modes"].items():
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        need(entry, ("server_modes", "rates"), f"modes.{mode}")
        for i, rate in enumerate(entry["rates"]):
            need(rate, SCHEMA["rate"], f"modes.{mode}.rates[{i}]")
            for key in ("ttft", "itl"):
                need(rate[key], SCHEMA["latency"], f"modes.{mode}.rates[{i}].{key}")
    if result["long_prompt"] is not None:
        need(result["long_prompt"], SCHEMA["long"], "long_prompt")


def long_prompt_summary(n: int, symmetric: list[float], asym: list[float], sym_bytes: float | None,
                        asym_bytes: float | None) -> dict:
    """The fastest of each mode's repeats (least disturbed by the machine), and their ratio."""
    s, a = min(symmetric), min(asym)
    return {"n": n, "repeats": len(symmetric), "symmetric_prefill_compute_s": round(s, 4),
            "asym_prefill_compute_s": round(a, 4), "asym_over_symmetric": round(a / s, 4), "goal": RATIO_GOAL,
            "goal_met": a / s <= RATIO_GOAL, "all_symmetric_s": [round(x, 4) for x in symmetric],
            "all_asym_s": [round(x, 4) for x in asym],
            "symmetric_payload_bytes": None if sym_bytes is None else round(sym_bytes),
            "asym_payload_bytes": None if asym_bytes is None else round(asym_bytes)}


# ---- talking to the servers ----------------------------------------------------------------
def stream_request(url: str, ids: list[int], max_new_tokens: int, timeout_s: float) -> RequestRecord:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
    record = RequestRecord(len(ids), time.perf_counter())
    chunks = []
    try:
        req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    record.error = json.dumps(event["error"])[:300]
                    break
                chunks.append((time.perf_counter(), event["meta_info"]["completion_tokens"]))
                finish = event["meta_info"].get("finish_reason")
                if finish and finish.get("type") == "abort":
                    record.error = json.dumps(finish)[:300]
    except Exception as exc:  # a failed request is reported, not fatal to the sweep
        record.error = f"{type(exc).__name__}: {exc}"[:300]
    record.token_times = token_times(chunks)
    return record


def scrape(server: ServerProcess) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as resp:
        return metric_totals(resp.read().decode(), (COMPUTE_METRIC, BYTES_METRIC))


@dataclass(frozen=True)
class RegularRouterConfig(RouterConfig):
    """sglang-router in regular (non-PD) mode in front of one colocated worker."""

    def command(self, prometheus_port: int, python: str = sys.executable) -> list[str]:
        pd = super().command(prometheus_port, python)  # one --prefill URL [PORT] and one --decode URL
        start, end = pd.index("--prefill"), pd.index("--decode") + 2
        return [a for a in pd[:start] if a != "--pd-disaggregation"] + ["--worker-urls", self.decode[0]] + pd[end:]


class ModeCluster:
    """The servers of one mode and the router in front of them; `prefill_side` is where P's metrics live."""

    def __init__(self, mode: str, checkpoint: Path, logs: Path, threads: int, flavor: RouterFlavor) -> None:
        self.mode, self.servers, self.router = mode, [], None
        env = {"OMP_NUM_THREADS": str(threads)}
        try:
            self.servers = [start_server(m, checkpoint, logs, "--transfer-timeout", "120", env=env)
                            for m in MODES[mode]]
            for server in self.servers:
                wait_healthy(server, timeout_s=600)
            first, last = self.servers[0], self.servers[-1]
            prefill = (PrefillWorker(first.url, first.bootstrap_port),)
            cls = RegularRouterConfig if mode == "colocated" else RouterConfig
            self.router = RouterProcess(cls(prefill=prefill, decode=(last.url,), port=pick_free_port(), flavor=flavor,
                                            request_timeout_s=1800, retry_max_retries=1,
                                            extra_args=("--disable-circuit-breaker",)), log_path=logs / f"router-{mode}.log")
            self.router.start(ready_timeout_s=180)
        except BaseException:
            self.stop()
            raise

    @property
    def prefill_side(self) -> ServerProcess:
        return self.servers[0]

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        for server in self.servers:
            server.stop()


def run_rate(cluster: ModeCluster, rate: float, prompts: list[list[int]], args, seed: int) -> dict:
    before = scrape(cluster.prefill_side)
    offsets = poisson_arrivals(rate, len(prompts), seed)
    start = time.perf_counter()

    def send(i: int) -> RequestRecord:
        time.sleep(max(0.0, start + offsets[i] - time.perf_counter()))
        return stream_request(cluster.router.url, prompts[i], args.max_new_tokens, args.request_timeout)

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        records = list(pool.map(send, range(len(prompts))))
    return rate_summary(rate, records, before, scrape(cluster.prefill_side))


def run_long(cluster: ModeCluster, args) -> tuple[list[float], float | None]:
    """Compute seconds of each N = long_n request (one at a time), and the payload bytes per request."""
    computes, before_all = [], scrape(cluster.prefill_side)
    for i in range(args.long_repeats):
        before = scrape(cluster.prefill_side)
        record = stream_request(cluster.router.url, prompt_ids(args.long_n, 10_000 + i), 2, args.request_timeout)
        if record.error is not None:
            raise RuntimeError(f"{cluster.mode}: the N={args.long_n} request failed: {record.error}")
        computes.append(per_request(before, scrape(cluster.prefill_side), COMPUTE_METRIC))
    payload = per_request(before_all, scrape(cluster.prefill_side), BYTES_METRIC)
    return computes, payload


# ---- the run ----------------------------------------------------------------------------------
def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    for mode, entry in result["modes"].items():
        rates = [r["rate_rps"] for r in entry["rates"]]
        for ax, key in ((axes[0], "ttft"), (axes[1], "itl")):
            line, = ax.plot(rates, [r[key]["p50_ms"] for r in entry["rates"]], marker="o", label=f"{mode} p50")
            ax.plot(rates, [r[key]["p99_ms"] for r in entry["rates"]], marker="x", ls="--", color=line.get_color(),
                    label=f"{mode} p99")
        axes[2].plot(rates, [r["output_throughput_tok_s"] for r in entry["rates"]], marker="o", label=mode)
    for ax, title in zip(axes[:3], ("TTFT (ms)", "ITL (ms)", "output throughput (tokens/s)")):
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(title)
        ax.legend(fontsize=7)
    long = result["long_prompt"]
    if long is not None:
        bars = axes[3].bar(["symmetric P", "asym P"], [long["symmetric_prefill_compute_s"],
                                                       long["asym_prefill_compute_s"]], color=["C1", "C2"])
        axes[3].bar_label(bars, fmt="%.1f s")
        axes[3].set_title(f"prefill compute / request at N={long['n']}: ratio {long['asym_over_symmetric']:.2f} "
                          f"(goal <= {long['goal']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "work-tmp" / "v41-small")
    parser.add_argument("--rates", default="0.2,1", help="request rates (req/s), comma-separated")
    parser.add_argument("--requests-per-rate", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--prompt-min", type=int, default=512)
    parser.add_argument("--prompt-max", type=int, default=1024)
    parser.add_argument("--long-n", type=int, default=4096, help="prompt length of the compute-ratio measurement")
    parser.add_argument("--long-repeats", type=int, default=2, help="N=long-n requests per PD mode (fastest counts)")
    parser.add_argument("--modes", default="colocated,symmetric,asym")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per server process")
    parser.add_argument("--router", choices=[f.value for f in RouterFlavor], default="sglang_router")
    parser.add_argument("--request-timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one rate, 2 requests of 160-300 tokens, 3 new tokens, N=1024 pair once")
    args = parser.parse_args(argv)
    if args.quick:
        args.rates, args.requests_per_rate, args.max_new_tokens = "1", 2, 3
        args.prompt_min, args.prompt_max, args.long_n, args.long_repeats = 160, 300, 1024, 1
    args.rate_list = [float(r) for r in args.rates.split(",") if r.strip()]
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.mode_list if m not in MODES]
    if unknown or not args.rate_list or args.requests_per_rate < 1 or not 1 <= args.prompt_min <= args.prompt_max:
        parser.error(f"bad --modes {unknown} / --rates / --requests-per-rate / --prompt-min..max")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.checkpoint / "config.json").exists():
        print(f"[serving] generating the small checkpoint in {args.checkpoint}", flush=True)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_checkpoint.py"), "--config", "small", "--seed",
                        "0", "--out", str(args.checkpoint), "--quiet"], check=True)
    logs = Path(tempfile.mkdtemp(prefix="sglang-asym-serving-"))
    rng = random.Random(args.seed)
    sweep = [[prompt_ids(rng.randint(args.prompt_min, args.prompt_max), args.seed * 1000 + r * 100 + i)
              for i in range(args.requests_per_rate)] for r in range(len(args.rate_list))]
    result = {"command": " ".join(["python benchmark/serving.py", *(argv if argv is not None else sys.argv[1:])]),
              "config": "small", "device": "cpu", "threads_per_server": args.threads,
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                           if k not in ("rate_list", "mode_list", "checkpoint", "out")},
              "modes": {}, "long_prompt": None, "logs": str(logs)}
    long_runs: dict[str, tuple[list[float], float | None]] = {}
    started = time.perf_counter()
    for mode in args.mode_list:
        t0 = time.perf_counter()
        cluster = ModeCluster(mode, args.checkpoint, logs, args.threads, RouterFlavor(args.router))
        print(f"[serving] {mode}: servers {MODES[mode]} up in {time.perf_counter() - t0:.0f} s", flush=True)
        try:
            rates = []
            for r, rate in enumerate(args.rate_list):
                rates.append(run_rate(cluster, rate, sweep[r], args, seed=args.seed * 10 + r))
                print(f"[serving] {mode} @ {rate} req/s: " + json.dumps({k: rates[-1][k] for k in (
                    "completed", "ttft", "itl", "output_throughput_tok_s", "prefill_compute_s_per_request",
                    "payload_bytes_per_request")}), flush=True)
            result["modes"][mode] = {"server_modes": list(MODES[mode]), "rates": rates}
            if mode in ("symmetric", "asym"):
                long_runs[mode] = run_long(cluster, args)
                print(f"[serving] {mode} N={args.long_n}: prefill compute {long_runs[mode][0]} s", flush=True)
        finally:
            cluster.stop()
    if set(long_runs) == {"symmetric", "asym"}:
        result["long_prompt"] = long_prompt_summary(args.long_n, long_runs["symmetric"][0], long_runs["asym"][0],
                                                    long_runs["symmetric"][1], long_runs["asym"][1])
    result["wall_s"] = round(time.perf_counter() - started, 1)
    check_schema(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serving.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "serving.png")
    print(json.dumps({"long_prompt": result["long_prompt"], "wall_s": result["wall_s"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
