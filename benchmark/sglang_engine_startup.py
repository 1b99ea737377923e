#!/usr/bin/env python
"""Start-up time and peak memory of SGLang's own engine on CPU, per server mode.

    .venv/bin/python benchmark/sglang_engine_startup.py

Writes the small V4.1 at SGLang's pool geometry (sglang_shapes.sglang_small, release precision) and
starts, one after another on 127.0.0.1, SGLang's null, prefill and decode servers
(`python -m sglang.launch_server --device cpu` with this plugin). For each: seconds from spawn to a
healthy /health and to the first completed /generate, and the peak resident memory (VmHWM) of every
process of the server's tree, summed, plus the largest single one (SGLang runs its model in a scheduler
process beside the launcher and the detokenizer). Writes benchmark/results/sglang_engine_startup.json.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from process_memory import process_tree  # benchmark/ is the script's own folder on sys.path
from sglang_asym.checkpoint import write_tokenizer
from sglang_asym.checkpoint.quantization import without_quantization
from sglang_asym.checkpoint.writer import write_checkpoint
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))  # test/harness/
from harness.sglang_shapes import sglang_small  # noqa: E402
from harness.server_process import post, start_server, wait_healthy  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("null", "prefill", "decode")
SGLANG_ENV = {"SGLANG_PLUGINS": "sglang_asym"}


def _peak_mb(pid: int) -> tuple[float, float]:
    peaks = []
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
        except FileNotFoundError:
            pass
    return round(sum(peaks), 1), round(max(peaks, default=0.0), 1)


def measure(mode: str, checkpoint: Path, logs: Path) -> dict:
    started = time.monotonic()
    server = start_server(mode, checkpoint, logs, "--device", "cpu", module="sglang.launch_server", env=SGLANG_ENV)
    try:
        wait_healthy(server, timeout_s=600)
        healthy_s = time.monotonic() - started
        first_s = None
        if mode == "null":
            status, resp = post(server.url + "/generate", {"input_ids": list(range(3, 203)),
                                                          "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
            assert status == 200, resp
            first_s = round(time.monotonic() - started, 1)
        total, largest = _peak_mb(server.proc.pid)
        return {"healthy_s": round(healthy_s, 1), "first_generate_s": first_s, "peak_rss_mb_sum": total,
                "peak_rss_mb_largest_process": largest}
    finally:
        server.stop()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, logs = Path(tmp) / "ckpt", Path(tmp) / "logs"
        logs.mkdir()
        write_checkpoint(checkpoint, without_quantization(sglang_small()), seed=11, precision="release",
                         num_shards=3, progress=False)
        write_tokenizer(checkpoint, sglang_small())
        rows = {}
        for mode in MODES:
            rows[f"sglang/{mode}"] = measure(mode, checkpoint, logs)
            print(f"sglang {mode:8s} {rows[f'sglang/{mode}']}", flush=True)
    report = {"benchmark": "sglang_engine_startup", "command": "python benchmark/sglang_engine_startup.py",
              "checkpoint": "sglang_shapes.sglang_small(), release precision, seed 11",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "runs": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sglang_engine_startup.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
