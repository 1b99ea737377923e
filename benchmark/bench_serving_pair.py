"""SGLang's own `bench_serving` against the mission's pair behind sglang-router.

`python -m sglang.launch_server --device cpu --disaggregation-mode asym-prefill | asym-decode` on the small
checkpoint (window 128), behind sglang-router as the system tests run it (sglang_servers.patient_router),
measured by `python -m sglang.bench_serving --backend sglang --dataset-name random-ids` (random token ids
sent as ids, no download; test/harness/bench_serving_client.py): prompts of 64 to 600 tokens (uniform), outputs
of 1 to 8 tokens (bench_serving applies one range ratio to both). Its success count, throughput and
TTFT / ITL / end-to-end percentiles (its own record) go to benchmark/results/bench_serving.json, with both
commands.

    .venv/bin/python benchmark/bench_serving_pair.py [--num-prompts 16 --input-len 600 --input-min 64 --output-len 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))
from harness.bench_serving_client import RandomLoad, requested_lengths, run_bench_serving, unserved  # noqa: E402
from harness.router_launch import RouterFlavor  # noqa: E402
from harness.server_process import wait_healthy  # noqa: E402
from system.sglang_servers import patient_router, sglang_server, write_sglang_checkpoint  # noqa: E402

WINDOW = 128
KEPT = ("completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
        "median_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms", "mean_tpot_ms", "median_e2e_latency_ms",
        "p99_e2e_latency_ms")


def summary(record: dict, load: RandomLoad) -> dict:
    """What the result file keeps of bench_serving's record (milliseconds as it reports them, rounded);
    `failed` counts the requests that did not get their whole output (bench_serving_client.unserved)."""
    missing = [key for key in KEPT if key not in record]
    if missing:
        raise KeyError(f"bench_serving's record lacks {missing}")
    kept = {key: round(record[key], 3) if isinstance(record[key], float) else record[key] for key in KEPT}
    failed = unserved(record, load)
    return {"requests": load.num_prompts, "served": load.num_prompts - len(failed), "failed": failed,
            "errors": [error for error in record["errors"] if error][:3], "input_lens": record["input_lens"],
            "requested_output_lens": requested_lengths(load)[1], "output_lens": record["output_lens"], **kept}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=600, help="longest prompt (tokens)")
    ap.add_argument("--input-min", type=int, default=64, help="shortest prompt (sets bench_serving's range ratio)")
    ap.add_argument("--output-len", type=int, default=8)
    # the pair serves about one such request per 18 s on 2 shared cores: at 4 in flight, requests queue past
    # the workers' 120 s request deadline (--asym-request-deadline-s)
    ap.add_argument("--max-concurrency", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds bench_serving may run")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmark" / "results" / "bench_serving.json")
    args = ap.parse_args(argv)
    load = RandomLoad(args.num_prompts, args.input_len, args.output_len, args.input_min / args.input_len,
                      args.max_concurrency, args.seed)
    flags = ("--asym-window", str(WINDOW))
    result: dict = {"command": "python benchmark/bench_serving_pair.py "
                    + " ".join(argv if argv is not None else sys.argv[1:]), "worker_flags": list(flags)}
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        checkpoint = write_sglang_checkpoint(Path(tmp) / "ckpt")
        logs = Path(tmp) / "logs"
        logs.mkdir()
        servers = [sglang_server("asym-prefill", checkpoint, logs, *flags),
                   sglang_server("asym-decode", checkpoint, logs, *flags)]
        try:
            for s in servers:
                wait_healthy(s, timeout_s=600)
            with patient_router(servers[0], servers[1], RouterFlavor.SGLANG_ROUTER,
                                log_path=logs / "router.log") as router:
                result["bench_serving"] = "python -m sglang.bench_serving " + " ".join(
                    a.replace(str(checkpoint), "<small checkpoint>").replace(router.url, "<router>")
                    for a in load.arguments(router.url, checkpoint, Path("<output.jsonl>")))
                start = time.monotonic()
                record = run_bench_serving(router.url, checkpoint, load, args.timeout)
                wall = time.monotonic() - start
        finally:
            for s in servers:
                s.stop()
    result["results"] = {**summary(record, load), "bench_wall_s": round(wall, 2)}
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if not result["results"]["failed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
