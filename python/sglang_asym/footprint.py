"""Weight footprint of the prefill role versus the full model, and whether a prefill replica fits.

    python -m sglang_asym.footprint --config flash            accounting from specs (nothing allocated)
    python -m sglang_asym.footprint --checkpoint DIR --role prefill|decode
                                                              a real load: tensors/bytes read, peak RSS

Both print one JSON object. Byte counts are at released storage precision (see
sglang_asym.checkpoint.accounting). KV sizes per token use the cache row formats of
docs/v41-model.md ("Row formats"): compressed main rows e2m1 + e4m3 scale per 16 channels, index-key rows
MXFP4, SWA rows fp8 + ue8m0 per 32 channels.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .checkpoint.accounting import BACKBONE_PARTS, PREFILL_BACKBONE_PARTS, Tally, part_tallies, partition
from .checkpoint.specs import released_nbytes
from .config import V41Config
from .layer_plan import LayerPlan

PUBLISHED_BACKBONE_PARAMS = 552e9  # DeepSeek-V4.1-Flash backbone
PUBLISHED_TOTAL_PARAMS = 763e9  # with Engram tables and the DSpark draft ("about 763B")
PREFILL_RATIO_ACCEPTANCE = 0.505
GPU_MEMORY_BYTES = {"H200": 141e9, "B300": 288e9, "GB200": 186e9}  # vendor figures, decimal GB


# ---- KV cache bytes (derived from the row formats) -----------------------------------------------
def main_kv_row_bytes(cfg: V41Config) -> int:
    return cfg.head_dim // 2 + cfg.head_dim // 16


def index_key_row_bytes(cfg: V41Config) -> int:
    return cfg.index_head_dim // 2 + cfg.index_head_dim // 32


def swa_row_bytes(cfg: V41Config) -> int:
    return cfg.head_dim + cfg.head_dim // 32


def global_kv_bytes_per_token(cfg: V41Config) -> float:
    """Prefix-cacheable compressed rows per prompt token, over all KV sources (890 B in Flash)."""
    row = main_kv_row_bytes(cfg) + index_key_row_bytes(cfg)
    return sum(row / cfg.compress_ratios[layer] for layer in cfg.kv_source_layer_ids)


def compressor_tail_bytes(cfg: V41Config) -> int:
    """Pending pair of a ratio-2 owner: fp32 value and gate of one token (4096 B in Flash)."""
    return 2 * cfg.head_dim * 4


# ---- fit ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FitAssumptions:
    prompt_budget_tokens: int = 1_048_576  # prompt tokens whose compressed KV one replica holds at once
    chunked_prefill_tokens: int = 8192  # tokens computed per forward step
    concurrent_requests: int = 8  # requests with live SWA windows / compressor tails
    reserve_bytes_per_gpu: int = 12_000_000_000  # activations, MoE/attention workspace, graphs, NCCL, slack
    engram_tables_on_gpu: bool = False  # False: tables in host memory (pure hashed lookups)
    gpu_counts: tuple[int, ...] = (1, 2, 4, 8)  # a replica's weights split evenly over its GPUs (TP/EP)

    def __post_init__(self) -> None:
        if not self.gpu_counts or self.gpu_counts[0] != 1 or list(self.gpu_counts) != sorted(set(self.gpu_counts)):
            raise ValueError(f"gpu_counts must be increasing and start at 1, got {self.gpu_counts}")
        if self.prompt_budget_tokens < 0 or self.reserve_bytes_per_gpu < 0:
            raise ValueError("prompt_budget_tokens and reserve_bytes_per_gpu must be >= 0")


def engram_bytes(cfg: V41Config) -> tuple[int, int]:
    """(table bytes, projection bytes) of the Engram memory at released storage."""
    tables = projections = 0
    for spec in partition(cfg)["engram"]:
        if spec.name.endswith("engram.embed.weight"):
            tables += released_nbytes(spec)
        else:
            projections += released_nbytes(spec)
    return tables, projections


def _role_memory(cfg: V41Config, tallies: dict[str, Tally], role: str, a: FitAssumptions) -> dict[str, Any]:
    plan = LayerPlan.from_config(cfg)
    if role == "prefill":
        weights = sum((tallies[p] for p in PREFILL_BACKBONE_PARTS), Tally())
        swa_layers = len(plan.encoder_layers)
    else:
        weights = sum((tallies[p] for p in BACKBONE_PARTS), Tally()) + tallies["dspark"]
        swa_layers = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
    tables, projections = engram_bytes(cfg)
    engram_on_gpu = projections + (tables if a.engram_tables_on_gpu else 0)
    weight_bytes = weights.bytes + engram_on_gpu
    per_token = global_kv_bytes_per_token(cfg)
    swa_rows = a.chunked_prefill_tokens + cfg.sliding_window * a.concurrent_requests
    state_bytes = (swa_layers * swa_row_bytes(cfg) * swa_rows
                   + len(plan.ratio2_owners) * compressor_tail_bytes(cfg) * a.concurrent_requests)
    kv_bytes = per_token * a.prompt_budget_tokens + state_bytes
    gpus = {}
    for gpu, capacity in GPU_MEMORY_BYTES.items():
        by_count = {}
        for n in a.gpu_counts:
            free = capacity * n - weight_bytes - a.reserve_bytes_per_gpu * n
            by_count[n] = {
                "free_for_kv_bytes": int(free),
                "fits_budget": free >= kv_bytes,
                "max_prompt_tokens": max(0, math.floor((free - state_bytes) / per_token)),
            }
        fitting = [n for n in a.gpu_counts if by_count[n]["fits_budget"]]
        gpus[gpu] = {
            "memory_bytes": int(capacity),
            "fits_on_one_gpu": by_count[1]["fits_budget"],
            "min_gpus_for_budget": fitting[0] if fitting else None,
            "by_gpu_count": {str(n): v for n, v in by_count.items()},
        }
    return {
        "weight_bytes_on_gpu": int(weight_bytes),
        "engram_bytes_on_gpu": int(engram_on_gpu),
        "kv_bytes_for_budget": int(kv_bytes),
        "kv_global_bytes_per_token": per_token,
        "swa_and_tail_state_bytes": int(state_bytes),
        "swa_layers": swa_layers,
        "gpus": gpus,
    }


def footprint_report(cfg: V41Config, preset: str, assumptions: FitAssumptions = FitAssumptions()) -> dict[str, Any]:
    tallies = part_tallies(cfg)
    plan = LayerPlan.from_config(cfg)
    last = plan.last_kv_source
    backbone = sum((tallies[p] for p in BACKBONE_PARTS), Tally())
    prefill = sum((tallies[p] for p in PREFILL_BACKBONE_PARTS), Tally())
    total = backbone + tallies["engram"] + tallies["dspark"]
    layer_ranges = {
        "encoder_layers": [0, last - 1],
        "kv_source_kv_path": [last, last],
        "kv_source_rest": [last, last],
        "decoder_layers": [last + 1, cfg.num_hidden_layers - 1],
        "engram": list(cfg.engram_layer_ids),
    }
    parts = {}
    for name, tally in tallies.items():
        entry = tally.as_dict()
        entry["gb"] = round(tally.bytes / 1e9, 3)
        if name in layer_ranges:
            entry["layers"] = layer_ranges[name]
        parts[name] = entry
    ratio = {
        "params": prefill.params / backbone.params,
        "bytes": prefill.bytes / backbone.bytes,
        "acceptance_max": PREFILL_RATIO_ACCEPTANCE,
    }
    ratio["ok"] = max(ratio["params"], ratio["bytes"]) <= PREFILL_RATIO_ACCEPTANCE
    report: dict[str, Any] = {
        "config": preset,
        "config_fingerprint": cfg.fingerprint(),
        "storage": {
            "fp8": "1 B/param + 1 B e8m0 scale per 32x32 block",
            "fp4": "0.5 B/param + 1 B e8m0 scale per row and 32 columns",
            "fp8_rows": "1 B/param + 1 B e8m0 scale per row and 32 columns (Engram tables)",
            "bf16": "2 B/param",
            "fp32": "4 B/param",
        },
        "last_kv_source": last,
        "parts": parts,
        "full": {
            "backbone": backbone.as_dict(),
            "engram": tallies["engram"].as_dict(),
            "dspark": tallies["dspark"].as_dict(),
            "total": total.as_dict(),
        },
        "prefill_role": {
            "parts": list(PREFILL_BACKBONE_PARTS),
            "backbone": prefill.as_dict(),
            "with_engram": (prefill + tallies["engram"]).as_dict(),
        },
        "prefill_over_full_backbone": ratio,
    }
    if preset == "flash":
        report["published_totals"] = {
            "backbone_params": PUBLISHED_BACKBONE_PARAMS,
            "total_params": PUBLISHED_TOTAL_PARAMS,
            "backbone_relative_error": backbone.params / PUBLISHED_BACKBONE_PARAMS - 1,
            "total_relative_error": total.params / PUBLISHED_TOTAL_PARAMS - 1,
        }
    report["fit"] = {
        "assumptions": {
            **{k: v for k, v in asdict(assumptions).items() if k != "gpu_counts"},
            "gpu_counts": list(assumptions.gpu_counts),
            "gpu_memory": "vendor capacity in decimal bytes (nvidia-smi shows ~140 GiB = 150e9 B for H200: "
                          "this is conservative)",
            "kv_global": f"{global_kv_bytes_per_token(cfg):g} B/prompt token: main {main_kv_row_bytes(cfg)} B + "
                         f"index {index_key_row_bytes(cfg)} B per row, one row per ratio tokens at layers "
                         f"{list(cfg.kv_source_layer_ids)}",
            "swa": f"{swa_row_bytes(cfg)} B/row per layer for chunked_prefill_tokens + window x "
                   "concurrent_requests rows",
            "engram": "projections always on GPU; tables on GPU only if engram_tables_on_gpu",
            "weights": "a replica of n GPUs splits every weight byte evenly over them (TP/EP, no replication)",
            "prefill_replica": "backbone parts " + ", ".join(PREFILL_BACKBONE_PARTS) + " + Engram projections",
            "full_replica": "whole backbone + DSpark + Engram projections (for comparison)",
        },
        "prefill_replica": _role_memory(cfg, tallies, "prefill", assumptions),
        "full_replica": _role_memory(cfg, tallies, "full", assumptions),
    }
    return report


# ---- real load ------------------------------------------------------------------------------------
def _ru_maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _peak_rss_bytes() -> int:
    """This process image's peak RSS (VmHWM). ru_maxrss is not reset by exec: a child started by
    vfork/posix_spawn begins with its parent's high-water mark, so it can overstate a fresh loader."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _ru_maxrss_bytes()


def load_report(checkpoint: str, role: str, dtype_name: str, progress: bool) -> dict[str, Any]:
    import torch

    from .checkpoint import CheckpointReader

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    baseline = _peak_rss_bytes()
    reader = CheckpointReader(checkpoint)
    weights = reader.load(role=role, dtype=dtype, progress=progress)
    peak = _peak_rss_bytes()
    stats = reader.stats
    return {
        "checkpoint": str(Path(checkpoint).resolve()),
        "role": role,
        "dtype": dtype_name,
        "config_fingerprint": reader.config.fingerprint(),
        "tensors_loaded": len(weights),
        "loaded_bytes": sum(t.numel() * t.element_size() for t in weights.values()),
        "tensors_read": stats.tensors_read,
        "bytes_read": stats.bytes_read,
        "shards_opened": list(stats.shards_opened),
        "shards_total": stats.shards_total,
        "load_seconds": round(stats.seconds, 3),
        "rss_before_load_bytes": baseline,
        "peak_rss_bytes": peak,
        "ru_maxrss_bytes": _ru_maxrss_bytes(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=("tiny", "small", "flash"), default="flash")
    parser.add_argument("--checkpoint", help="load this checkpoint for --role and report reads and peak RSS")
    parser.add_argument("--role", choices=("prefill", "decode"))
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--prompt-budget-tokens", type=int, default=FitAssumptions.prompt_budget_tokens)
    parser.add_argument("--reserve-gb", type=float, default=FitAssumptions.reserve_bytes_per_gpu / 1e9,
                        help="per-GPU activation/workspace reserve")
    parser.add_argument("--engram-on-gpu", action="store_true", help="count the Engram tables as GPU-resident")
    parser.add_argument("--progress", action="store_true", help="progress bar on stderr while loading")
    parser.add_argument("--out", help="also write the JSON to this file")
    args = parser.parse_args(argv)

    if args.checkpoint:
        if not args.role:
            parser.error("--checkpoint needs --role")
        report = load_report(args.checkpoint, args.role, args.dtype, args.progress)
    else:
        if args.role:
            parser.error("--role needs --checkpoint")
        assumptions = FitAssumptions(
            prompt_budget_tokens=args.prompt_budget_tokens,
            reserve_bytes_per_gpu=int(args.reserve_gb * 1e9),
            engram_tables_on_gpu=args.engram_on_gpu,
        )
        report = footprint_report(V41Config.preset(args.config), args.config, assumptions)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
