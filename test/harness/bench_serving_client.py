"""SGLang's own `python -m sglang.bench_serving` on its random dataset against a running server or router.

The `random-ids` dataset (random token ids, no download); the result is the JSON record bench_serving writes.

bench_serving imports `sglang.srt.configs`, which reaches torchvision (no CPU build on PyPI): it runs in a
process that installs the project's CPU import stand-in first (cpu_platform/import_gaps.py), as SGLang's
spawned processes on this machine do. Prompts are sent as token ids (`--tokenize-prompt`), so each is
exactly its sampled length. bench_serving counts a stream that opened with 200 as a success even when it
ends on an error event (a request aborted mid-way), so a request counts as served here only when its output
is as long as the length bench_serving asked for (ignore_eos is its default): `unserved`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# `python -m sglang.bench_serving`, after the CPU stand-in for torchvision is in place
BENCH_RUNNER = ("import runpy, sys; "
                "from sglang_asym.sglang_plugin.cpu_platform import import_gaps; "
                "from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS; "
                "import_gaps.install(STARTUP_GAPS); sys.argv[0] = 'sglang.bench_serving'; "
                "runpy.run_module('sglang.bench_serving', run_name='__main__', alter_sys=True)")


@dataclass(frozen=True)
class RandomLoad:
    """bench_serving's random dataset: input lengths uniform in [input_len * range_ratio, input_len], output
    lengths likewise in [max(1, output_len * range_ratio), output_len] (SGLang's compute_random_lens)."""

    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float
    max_concurrency: int
    seed: int = 1

    def arguments(self, base_url: str, checkpoint: Path, output_file: Path) -> list[str]:
        return ["--backend", "sglang", "--base-url", base_url, "--model", str(checkpoint), "--tokenizer",
                str(checkpoint), "--dataset-name", "random-ids", "--tokenize-prompt", "--num-prompts",
                str(self.num_prompts), "--random-input-len", str(self.input_len), "--random-output-len",
                str(self.output_len), "--random-range-ratio", str(self.range_ratio), "--max-concurrency",
                str(self.max_concurrency), "--seed", str(self.seed), "--disable-tqdm", "--output-details",
                "--output-file", str(output_file)]


def run_bench_serving(base_url: str, checkpoint: Path, load: RandomLoad, timeout_s: float) -> dict:
    """bench_serving's JSON record of one run against `base_url` (it raises when bench_serving fails)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        output_file = Path(tmp) / "bench_serving.jsonl"
        run = subprocess.run([sys.executable, "-c", BENCH_RUNNER, *load.arguments(base_url, checkpoint, output_file)],
                             env=env, capture_output=True, text=True, timeout=timeout_s)
        if run.returncode != 0 or not output_file.exists():
            raise RuntimeError(f"bench_serving failed (exit {run.returncode}):\n"
                               f"{run.stdout[-4000:]}\n{run.stderr[-4000:]}")
        return json.loads(output_file.read_text().splitlines()[-1])


def requested_lengths(load: RandomLoad) -> tuple[list[int], list[int]]:
    """The input and output lengths bench_serving draws for `load`: its seed, then SGLang's
    compute_random_lens for the inputs and then the outputs, as its random dataset draws them."""
    from sglang.benchmark.datasets.common import compute_random_lens

    np.random.seed(load.seed)
    inputs = compute_random_lens(load.input_len, load.range_ratio, load.num_prompts)
    return inputs, compute_random_lens(load.output_len, load.range_ratio, load.num_prompts)


def unserved(record: dict, load: RandomLoad) -> list[int]:
    """Indices of the requests bench_serving failed or that ended before their requested output length
    (a record of another draw than `load`'s raises)."""
    inputs, outputs = requested_lengths(load)
    if record["input_lens"] != inputs:
        raise ValueError(f"bench_serving sent inputs of {record['input_lens']}, not the {inputs} of its seed")
    return [i for i, (got, asked, error) in enumerate(zip(record["output_lens"], outputs, record["errors"]))
            if error or got != asked]
