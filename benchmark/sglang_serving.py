"""SGLang's own engine on CPU: the asymmetric pair against SGLang's symmetric PD, through the same router
on the same checkpoint, one long request at a time.

Both pairs are `python -m sglang.launch_server --device cpu` (SGLang's scheduler, PD queues and Mooncake
over TCP; the forward is the reference model over SGLang's pool): `prefill` + `decode` (P runs the whole
prompt through all 40 layers) and `asym-prefill` + `asym-decode` (P runs [0, N - W) through layers 0-20's
KV path, D runs the last W rows). Each pair is started, measured and stopped in turn, with sglang-router
in front. Per pair, for prompts of N tokens (streamed /generate, greedy, ignore_eos):
  TTFT and ITL (client side), P's forward seconds and rows per request (the reference forward's log,
  SGLANG_ASYM_FORWARD_LOG), D's, and the bytes on the wire per request (P's `sglang:kv_transfer_total_mb`
  histogram: for the symmetric pair SGLang's own count of the page items its sender moves; for the asym
  pair the rows the exact-payload manager wrote, which is the SplitPlan manifest). Ratios asym /
  symmetric are measured side by side in one run.
Writes benchmark/results/sglang_serving.json.

    .venv/bin/python benchmark/sglang_serving.py [--n 4096] [--repeats 1] [--new-tokens 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

from serving import metric_totals, stream_request

from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess
from sglang_asym.testing.server_process import start_server, wait_healthy

RESULTS = Path(__file__).resolve().parent / "results"
PAIRS = {"symmetric": ("prefill", "decode"), "asym": ("asym-prefill", "asym-decode")}
BYTES_METRIC = "sglang:kv_transfer_total_mb"


def prompt(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 700 + 3 for i in range(n)]


def forward_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def role_work(records: list[dict]) -> dict:
    """Seconds and rows of the forwards that computed a routed request (room set: not a health check)."""
    mine = [r for r in records if any(room for room, _, _ in r["rows"])]
    return {"seconds": round(sum(r["seconds"] for r in mine), 3),
            "rows": sum(e - s for r in mine for room, s, e in r["rows"] if room), "forwards": len(mine)}


def transfer_mb(url: str) -> tuple[float, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        totals = metric_totals(resp.read().decode(), (BYTES_METRIC,))
    return totals[f"{BYTES_METRIC}_sum"], totals[f"{BYTES_METRIC}_count"]


def run_pair(name: str, checkpoint: Path, work: Path, args) -> dict:
    modes = PAIRS[name]
    logs = {mode: work / f"{name}-{mode}.jsonl" for mode in modes}
    env = {"SGLANG_PLUGINS": "sglang_asym", "OMP_NUM_THREADS": str(args.threads)}
    servers = [start_server(mode, checkpoint, work, "--device", "cpu", "--enable-metrics", module="sglang.launch_server",
                            env={**env, "SGLANG_ASYM_FORWARD_LOG": str(logs[mode])}) for mode in modes]
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
        runs = []
        for i in range(args.repeats):
            for path in logs.values():
                path.unlink(missing_ok=True)
            mb_before = transfer_mb(prefill.url)
            record = stream_request(router.url, prompt(args.n, seed=i), args.new_tokens, args.request_timeout)
            if record.error:
                raise RuntimeError(f"{name}: request {i} failed: {record.error}")
            mb_after = transfer_mb(prefill.url)
            itl = record.itl()
            runs.append({
                "ttft_s": round(record.ttft, 3), "itl_mean_ms": round(1000 * statistics.fmean(itl), 1),
                "prefill": role_work(forward_log(logs[modes[0]])), "decode": role_work(forward_log(logs[modes[1]])),
                "transfer_mb": round(mb_after[0] - mb_before[0], 4) if mb_after[1] > mb_before[1] else None,
            })
            print(f"[{name}] N={args.n}: {runs[-1]}", flush=True)
        return {"modes": list(modes), "runs": runs}
    finally:
        if router is not None:
            router.stop()
        for server in servers:
            server.stop()


def best(pair: dict, key: str, sub: str | None = None) -> float:
    values = [run[key][sub] if sub else run[key] for run in pair["runs"]]
    return min(v for v in values if v is not None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a V4.1 checkpoint with SGLang's pool geometry (default: generate sglang_small)")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--request-timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "sglang_serving.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sglang_serving_") as tmp:
        work = Path(tmp)
        checkpoint = args.checkpoint
        if checkpoint is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))
            from system.sglang_servers import write_sglang_checkpoint

            checkpoint = write_sglang_checkpoint(work / "ckpt")
        pairs = {name: run_pair(name, checkpoint, work, args) for name in PAIRS}
    sym, asym = pairs["symmetric"], pairs["asym"]
    ratios = {
        "prefill_compute": round(best(asym, "prefill", "seconds") / best(sym, "prefill", "seconds"), 3),
        "prefill_rows": round(best(asym, "prefill", "rows") / best(sym, "prefill", "rows"), 3),
        "ttft": round(best(asym, "ttft_s") / best(sym, "ttft_s"), 3),
        "itl": round(best(asym, "itl_mean_ms") / best(sym, "itl_mean_ms"), 3),
        "transfer_mb": round(best(asym, "transfer_mb") / best(sym, "transfer_mb"), 3),
    }
    result = {"command": "cd benchmark && ../.venv/bin/python sglang_serving.py " + " ".join(argv or sys.argv[1:]),
              "n": args.n, "new_tokens": args.new_tokens, "threads_per_server": args.threads, "pairs": pairs,
              "asym_over_symmetric": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(ratios), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
