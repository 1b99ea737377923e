"""SGLang's own `bench_serving` against the mission's pair behind sglang-router.

`python -m sglang.launch_server --device cpu --disaggregation-mode asym-prefill | asym-decode` on the small
checkpoint (window 128), behind sglang-router as the system tests run it (sglang_servers.patient_router),
measured by `python -m sglang.bench_serving --backend sglang --dataset-name random-ids`: prompts of random
token ids sent as token ids (--tokenize-prompt, so each prompt is exactly --input-len tokens), which needs
no download. Its success count, throughput and TTFT / ITL / end-to-end percentiles (its own JSONL record)
go to benchmark/results/bench_serving.json, with both commands.

bench_serving imports `sglang.srt.configs`, which reaches torchvision (no CPU build on PyPI): it runs in a
process that installs the project's CPU import stand-in first (cpu_platform/import_gaps.py), as SGLang's
spawned processes on this machine do.

    .venv/bin/python benchmark/bench_serving_pair.py [--num-prompts 16 --input-len 300 --output-len 16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglang_asym.testing.router_launch import RouterFlavor
from sglang_asym.testing.server_process import wait_healthy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))
from system.sglang_servers import patient_router, sglang_server, write_sglang_checkpoint  # noqa: E402

WINDOW = 128
# bench_serving as `python -m sglang.bench_serving`, after the CPU stand-in for torchvision is in place
BENCH_RUNNER = ("import runpy, sys; "
                "from sglang_asym.sglang_plugin.cpu_platform import import_gaps; "
                "from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS; "
                "import_gaps.install(STARTUP_GAPS); sys.argv[0] = 'sglang.bench_serving'; "
                "runpy.run_module('sglang.bench_serving', run_name='__main__', alter_sys=True)")
KEPT = ("completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
        "median_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms", "mean_tpot_ms", "median_e2e_latency_ms",
        "p99_e2e_latency_ms")


def bench_arguments(base_url: str, checkpoint: Path, args: argparse.Namespace, output_file: Path) -> list[str]:
    return ["--backend", "sglang", "--base-url", base_url, "--model", str(checkpoint), "--tokenizer", str(checkpoint),
            "--dataset-name", "random-ids", "--tokenize-prompt", "--num-prompts", str(args.num_prompts),
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--random-range-ratio", "1", "--max-concurrency", str(args.max_concurrency), "--seed", str(args.seed),
            "--disable-tqdm", "--output-file", str(output_file)]


def summary(record: dict, num_prompts: int) -> dict:
    """What the result file keeps of bench_serving's record (milliseconds as it reports them, rounded)."""
    missing = [key for key in KEPT if key not in record]
    if missing:
        raise KeyError(f"bench_serving's record lacks {missing}")
    kept = {key: round(record[key], 3) if isinstance(record[key], float) else record[key] for key in KEPT}
    return {"requests": num_prompts, "failed": num_prompts - record["completed"], **kept}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=300)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--max-concurrency", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds bench_serving may run")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmark" / "results" / "bench_serving.json")
    args = ap.parse_args(argv)
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
                output_file = Path(tmp) / "bench_serving.jsonl"
                bench = bench_arguments(router.url, checkpoint, args, output_file)
                result["bench_serving"] = "python -m sglang.bench_serving " + " ".join(
                    a.replace(str(checkpoint), "<small checkpoint>").replace(router.url, "<router>") for a in bench)
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")]))}
                start = time.monotonic()
                run = subprocess.run([sys.executable, "-c", BENCH_RUNNER, *bench], env=env, capture_output=True,
                                     text=True, timeout=args.timeout)
                wall = time.monotonic() - start
                if run.returncode != 0 or not output_file.exists():
                    sys.stderr.write(run.stdout[-4000:] + run.stderr[-4000:])
                    raise SystemExit(f"bench_serving failed (exit {run.returncode})")
                record = json.loads(output_file.read_text().splitlines()[-1])
        finally:
            for s in servers:
                s.stop()
    result["results"] = {**summary(record, args.num_prompts), "bench_wall_s": round(wall, 2)}
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
