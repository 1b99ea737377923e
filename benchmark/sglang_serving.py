"""SGLang's own engine on CPU: the asymmetric pair, SGLang's default symmetric PD (P with bounded replay) and the
old full-compute symmetric PD, through the same router on the same checkpoint, one long request at a time.

Every pair is `python -m sglang.launch_server --device cpu` (SGLang's scheduler, PD queues and Mooncake over TCP;
the asym-prefill forward is SGLang's own DeepSeek-V4 layer loop with P's cut and the reference model's blocks as
its layers, every other forward the reference model over SGLang's pool), started, measured over every N (smallest
first) and stopped in turn, with sglang-router in front:
  asym                    asym-prefill + asym-decode: P runs [0, B) (B = N - W) through layers 0-19 and layer
                          20's KV path, D runs the last W rows through every layer;
  symmetric               prefill + decode, SGLang's default (the baseline of every ratio): P runs [0, B) through
                          layers 0-19 and layer 20's KV path, [B, N) through every layer (bounded replay);
  symmetric-full-compute  prefill + decode with SGLANG_ASYM_FULL_COMPUTE=1: P runs every row through every layer
                          (the old baseline, labelled as such).
The checkpoint is the test suite's small V4.1 at SGLang's pool geometry, with its YaRN factor raised when the
longest N needs more than its 16,384 positions (N = 16384 plus the new tokens: 32,768 positions, factor 8); pass
--max-total-tokens above the longest N, since SGLang's pool on CPU holds 8,192 tokens by default.
Per request (streamed /generate, greedy, ignore_eos): TTFT and ITL (client side); P's and D's forward seconds,
rows, and rows run through the last layer (the reference forward's log, SGLANG_ASYM_FORWARD_LOG); bytes on the
wire (P's `sglang:kv_transfer_total_mb` histogram: for the symmetric pairs SGLang's count of the page items its
sender moves, for the asym pair the rows the exact-payload manager wrote, the SplitPlan manifest); P's and D's
resident memory (process tree, VmRSS) idle before the request and its peak during it; the 1-minute load average.
Ratios over the baseline come from the one run. Writes the JSON after every request (--out).

    cd benchmark && ../.venv/bin/python sglang_serving.py --n 512 2048 4096 16384 --max-total-tokens 20480 \
        [--new-tokens 16] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from process_memory import PeakRss, tree_rss_mb
from stream_client import metric_totals, stream_request

from sglang_asym.sglang_plugin.cpu_platform.replay_mode import FULL_COMPUTE_ENV
from sglang_asym.sglang_plugin.shared.pool_dump import FORWARD_LOG_ENV
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))  # test/harness/
from harness.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess  # noqa: E402
from harness.server_process import start_server, wait_healthy  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BYTES_METRIC = "sglang:kv_transfer_total_mb"
BASELINE = "symmetric"


@dataclass(frozen=True)
class Pair:
    modes: tuple[str, str]
    what: str
    env: dict[str, str] = field(default_factory=dict)


PAIRS = {
    "asym": Pair(("asym-prefill", "asym-decode"),
                 "asymmetric PD: P runs [0, B) through layers 0-19 and layer 20's KV path, D the last W rows"),
    "symmetric": Pair(("prefill", "decode"),
                      "SGLang's default symmetric PD: P with bounded replay (layers 0-19 and layer 20's KV path on "
                      "[0, B), every layer on [B, N))"),
    "symmetric-full-compute": Pair(("prefill", "decode"),
                                   "old baseline: symmetric PD whose P runs every prompt row through every layer",
                                   {FULL_COMPUTE_ENV: "1"}),
}


def prompt(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 700 + 3 for i in range(n)]


def forward_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def role_work(records: list[dict], last_layer: int) -> dict:
    """Seconds and rows of the forwards that computed a routed request (room set: not a health check), and the
    rows of the passes that ran the last layer (the forward log's `pieces`; a log without them ran none)."""
    mine = [r for r in records if any(room for room, _, _ in r["rows"])]
    late = sum(e - s for r in mine for p in r.get("pieces", ()) if last_layer in p["layers"]
               for room, s, e in p["rows"] if room)
    return {"seconds": round(sum(r["seconds"] for r in mine), 3),
            "rows": sum(e - s for r in mine for room, s, e in r["rows"] if room), "last_layer_rows": late,
            "forwards": len(mine)}


def transfer_mb(url: str) -> tuple[float, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        totals = metric_totals(resp.read().decode(), (BYTES_METRIC,))
    return totals[f"{BYTES_METRIC}_sum"], totals[f"{BYTES_METRIC}_count"]


def run_pair(name: str, checkpoint: Path, work: Path, args, last_layer: int, record) -> None:
    """Start the pair, run every N (args.repeats each), stop it; `record(name, n, run)` gets each request."""
    pair = PAIRS[name]
    logs = {mode: work / f"{name}-{mode}.jsonl" for mode in pair.modes}
    env = {"SGLANG_PLUGINS": "sglang_asym", "OMP_NUM_THREADS": str(args.threads), **pair.env}
    extra = ("--max-total-tokens", str(args.max_total_tokens)) if args.max_total_tokens else ()
    servers = [start_server(mode, checkpoint, work, "--device", "cpu", "--enable-metrics", *extra,
                            module="sglang.launch_server", env={**env, FORWARD_LOG_ENV: str(logs[mode])})
               for mode in pair.modes]
    router = None
    try:
        for server in servers:
            wait_healthy(server, timeout_s=900)
        prefill, decode = servers
        router = RouterProcess(RouterConfig(
            prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),), decode=(decode.url,),
            flavor=RouterFlavor.SGLANG_ROUTER, retry_max_retries=1,
            extra_args=("--disable-circuit-breaker", "--health-check-timeout-secs", "120",
                        "--health-failure-threshold", "20")))
        router.start(ready_timeout_s=300)
        warm = stream_request(router.url, prompt(200, seed=99), 2, args.request_timeout)
        if warm.error:
            raise RuntimeError(f"{name}: warm-up request failed: {warm.error}")
        for n in sorted(args.n):
            for i in range(args.repeats):
                for path in logs.values():
                    path.unlink(missing_ok=True)
                mb_before = transfer_mb(prefill.url)
                idle = {"prefill": tree_rss_mb(prefill.proc.pid), "decode": tree_rss_mb(decode.proc.pid)}
                load_before = os.getloadavg()[0]
                with PeakRss({"prefill": prefill.proc.pid, "decode": decode.proc.pid}) as peak:
                    got = stream_request(router.url, prompt(n, seed=i), args.new_tokens, args.request_timeout)
                if got.error:
                    raise RuntimeError(f"{name}: N={n} request {i} failed: {got.error}")
                mb_after = transfer_mb(prefill.url)
                itl = got.itl()
                record(name, n, {
                    "ttft_s": round(got.ttft, 3), "itl_mean_ms": round(1000 * statistics.fmean(itl), 1),
                    "itl_median_ms": round(1000 * statistics.median(itl), 1),
                    "prefill": role_work(forward_log(logs[pair.modes[0]]), last_layer),
                    "decode": role_work(forward_log(logs[pair.modes[1]]), last_layer),
                    "transfer_mb": round(mb_after[0] - mb_before[0], 4) if mb_after[1] > mb_before[1] else None,
                    "memory_mb": {role: {"idle": round(idle[role], 1), "peak": round(peak.mb[role], 1)}
                                  for role in ("prefill", "decode")},
                    "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                })
    finally:
        if router is not None:
            router.stop()
        for server in servers:
            server.stop()


def best(runs: list[dict], *path: str) -> float | None:
    values = []
    for run in runs:
        value = run
        for key in path:
            value = value[key]
        values.append(value)
    values = [v for v in values if v is not None]
    return min(values) if values else None


METRICS = {"prefill_compute": ("prefill", "seconds"), "prefill_rows": ("prefill", "rows"),
           "prefill_last_layer_rows": ("prefill", "last_layer_rows"), "ttft": ("ttft_s",), "itl": ("itl_mean_ms",),
           "transfer_mb": ("transfer_mb",), "prefill_peak_memory": ("memory_mb", "prefill", "peak"),
           "decode_peak_memory": ("memory_mb", "decode", "peak")}


def ratios(pairs: dict, n: int) -> dict:
    """Each pair over the baseline (and asym over the full-compute baseline) at N, best of the repeats."""
    key = str(n)
    out = {}
    for top, bottom in (("asym", BASELINE), ("symmetric-full-compute", BASELINE), ("asym", "symmetric-full-compute")):
        a, b = pairs.get(top, {}).get("runs", {}).get(key), pairs.get(bottom, {}).get("runs", {}).get(key)
        if not a or not b:
            continue
        row = {}
        for metric, path in METRICS.items():
            x, y = best(a, *path), best(b, *path)
            row[metric] = round(x / y, 3) if x is not None and y else None
        out[f"{top} / {bottom}"] = row
    return out


def serving_config(context: int):
    """sglang_small (SGLang's pool geometry, 16,384 positions) with at least `context` positions: the YaRN
    factor over its original 4,096 positions grows to the next power of two that holds them."""
    from harness.sglang_shapes import sglang_small

    cfg = sglang_small()
    scaling = dict(cfg.rope_scaling)
    positions = cfg.max_position_embeddings
    while positions < context:
        positions *= 2
    scaling["factor"] = positions // scaling["original_max_position_embeddings"]
    return cfg.replace(max_position_embeddings=positions, rope_scaling=tuple(sorted(scaling.items())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a V4.1 checkpoint with SGLang's pool geometry (default: generate sglang_small)")
    parser.add_argument("--n", type=int, nargs="+", default=[4096])
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-total-tokens", type=int, default=None, help="SGLang's pool size (N above 8k)")
    parser.add_argument("--request-timeout", type=float, default=1800.0)
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    parser.add_argument("--out", type=Path, default=RESULTS / "sglang_serving.json")
    args = parser.parse_args(argv)
    pairs = {name: {"modes": list(PAIRS[name].modes), "what": PAIRS[name].what, "env": PAIRS[name].env, "runs": {}}
             for name in args.pairs}
    result = {"command": "cd benchmark && ../.venv/bin/python sglang_serving.py " + " ".join(argv or sys.argv[1:]),
              "note": args.note, "cpus": os.cpu_count(), "n": sorted(args.n), "new_tokens": args.new_tokens,
              "threads_per_server": args.threads, "baseline": f"{BASELINE}: {PAIRS[BASELINE].what}",
              "pairs": pairs, "ratios": {}}

    def record(name: str, n: int, run: dict) -> None:
        pairs[name]["runs"].setdefault(str(n), []).append(run)
        result["ratios"] = {str(m): r for m in sorted(args.n) if (r := ratios(pairs, m))}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"[{name}] N={n}: {json.dumps(run)}", flush=True)

    with tempfile.TemporaryDirectory(prefix="sglang_serving_") as tmp:
        work = Path(tmp)
        checkpoint = args.checkpoint
        if checkpoint is None:
            from system.sglang_servers import write_sglang_checkpoint

            checkpoint = write_sglang_checkpoint(work / "ckpt", serving_config(max(args.n) + args.new_tokens))
        from sglang_asym.config import V41Config

        last_layer = V41Config.from_json_file(checkpoint).num_hidden_layers - 1
        for name in args.pairs:
            run_pair(name, checkpoint, work, args, last_layer, record)
    for n, row in result["ratios"].items():
        for pair_ratio, values in row.items():
            print(f"N={n} {pair_ratio} (baseline named last): {json.dumps(values)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
