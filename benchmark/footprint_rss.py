#!/usr/bin/env python
"""Peak resident memory of loading the prefill role versus the decode role (= the whole backbone).

    .venv/bin/python benchmark/footprint_rss.py

Writes the small preset's checkpoint (release precision: FP8/FP4 + e8m0 scales, 9 shards) into a
temporary directory, then loads it twice in fresh subprocesses, `python -m sglang_asym.footprint
--checkpoint DIR --role prefill|decode` (float32 tensors), and records each process's peak RSS
(ru_maxrss) and the ratio prefill/decode (goal <= 0.6). Also writes the Flash accounting
(`python -m sglang_asym.footprint --config flash`) to benchmark/results/footprint_flash.json.

A process's peak RSS is a constant (interpreter + torch + reader bookkeeping) plus about one byte per
loaded byte. The report fits that line through the two runs and, if the ratio misses the goal because
the constant dominates, states how wide the small preset's experts would need to be.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sglang_asym.checkpoint import write_checkpoint
from sglang_asym.config import V41Config
from sglang_asym.layer_plan import LayerPlan
from sglang_asym.tensor_specs import backbone_tensor_specs

RESULTS = Path(__file__).resolve().parent / "results"
GOAL = 0.6
MARGIN_GOAL = 0.58  # width suggestion aims below the goal so run-to-run noise does not flip it
SEED = 0


def role_float32_bytes(cfg: V41Config) -> dict[str, int]:
    plan = LayerPlan.from_config(cfg)
    specs = backbone_tensor_specs(cfg)
    return {
        "prefill": 4 * sum(s.numel for s in specs if s.name in plan.prefill_tensor_names),
        "decode": 4 * sum(s.numel for s in specs),
    }


def load_in_subprocess(checkpoint: Path, role: str) -> tuple[dict, list[str]]:
    command = [sys.executable, "-m", "sglang_asym.footprint", "--checkpoint", str(checkpoint), "--role", role]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(proc.stdout), command


def suggest_width(constant: float, slope: float) -> dict:
    """Smallest moe_intermediate_size (multiple of 32) whose projected RSS ratio is <= MARGIN_GOAL."""
    small = V41Config.small()
    for inter in range(small.moe_intermediate_size, 8 * small.moe_intermediate_size + 1, 32):
        loaded = role_float32_bytes(small.replace(moe_intermediate_size=inter))
        projected = (constant + slope * loaded["prefill"]) / (constant + slope * loaded["decode"])
        if projected <= MARGIN_GOAL:
            return {"moe_intermediate_size": inter, "projected_ratio": round(projected, 4),
                    "decode_float32_bytes": loaded["decode"]}
    return {}


def main() -> int:
    RESULTS.mkdir(exist_ok=True)
    cfg = V41Config.small()
    with tempfile.TemporaryDirectory(prefix="v41-small-") as tmp:
        checkpoint = Path(tmp) / "ckpt"
        start = time.perf_counter()
        summary = write_checkpoint(checkpoint, cfg, SEED, precision="release", num_shards=9, progress=False)
        write_seconds = time.perf_counter() - start
        runs, commands = {}, {}
        for role in ("prefill", "decode"):
            runs[role], commands[role] = load_in_subprocess(checkpoint, role)
    prefill, decode = runs["prefill"], runs["decode"]
    ratio = prefill["peak_rss_bytes"] / decode["peak_rss_bytes"]
    slope = (decode["peak_rss_bytes"] - prefill["peak_rss_bytes"]) / (decode["loaded_bytes"] - prefill["loaded_bytes"])
    constant = prefill["peak_rss_bytes"] - slope * prefill["loaded_bytes"]
    report = {
        "benchmark": "footprint_rss",
        "command": f"{Path(sys.executable).name} benchmark/footprint_rss.py",
        "role_commands": {role: " ".join(c[:1] + c[1:4] + ["<tmp>/ckpt"] + c[5:]) for role, c in commands.items()},
        "checkpoint": {
            "config": "small", "seed": SEED, "precision": "release", "shards": list(summary.files),
            "stored_bytes": summary.total_bytes, "write_seconds": round(write_seconds, 2),
        },
        "prefill": prefill | {"checkpoint": "<tmp>/ckpt"},
        "decode": decode | {"checkpoint": "<tmp>/ckpt"},
        "peak_rss_ratio_prefill_over_decode": round(ratio, 4),
        "goal": GOAL,
        "goal_met": ratio <= GOAL,
        "loaded_bytes_ratio": round(prefill["loaded_bytes"] / decode["loaded_bytes"], 4),
        "rss_above_start_ratio": round(
            (prefill["peak_rss_bytes"] - prefill["rss_before_load_bytes"])
            / (decode["peak_rss_bytes"] - decode["rss_before_load_bytes"]), 4),
        "fit": {"constant_bytes": int(constant), "rss_bytes_per_loaded_byte": round(slope, 4),
                "note": "peak_rss = constant + slope * loaded_bytes, through the two runs"},
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "machine": platform.machine(), "torch_threads": torch.get_num_threads()},
    }
    if ratio > GOAL or ratio > MARGIN_GOAL:
        report["small_preset_width_for_margin"] = suggest_width(constant, slope) | {"target_ratio": MARGIN_GOAL}
    (RESULTS / "footprint_rss.json").write_text(json.dumps(report, indent=2) + "\n")

    flash = subprocess.run([sys.executable, "-m", "sglang_asym.footprint", "--config", "flash"],
                           capture_output=True, text=True, timeout=300, check=True)
    flash_report = json.loads(flash.stdout)
    flash_report["command"] = f"{Path(sys.executable).name} -m sglang_asym.footprint --config flash"
    (RESULTS / "footprint_flash.json").write_text(json.dumps(flash_report, indent=2) + "\n")

    print(json.dumps({k: report[k] for k in ("peak_rss_ratio_prefill_over_decode", "goal_met", "loaded_bytes_ratio",
                                              "rss_above_start_ratio")}))
    print(f"prefill peak RSS {prefill['peak_rss_bytes'] / 1e6:.0f} MB, decode {decode['peak_rss_bytes'] / 1e6:.0f} MB; "
          f"Flash prefill/backbone params {flash_report['prefill_over_full_backbone']['params']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
