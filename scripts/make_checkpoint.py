#!/usr/bin/env python
"""Write a random-weight DeepSeek-V4.1 checkpoint in the released layout, with a tokenizer.

    scripts/make_checkpoint.py --seed 0 --out /tmp/v41-sglang-small [--config sglang-small] [--precision release]

sglang-small (the default) is the 40-layer schedule at the attention geometry SGLang's V4.1 cache pool holds
(head_dim 512); sglang-tiny is the nine-layer tiny config at that geometry, the smallest checkpoint
`python -m sglang.launch_server` serves (the trained model's config). tiny and small (head_dim 64) are the
reference library's unit-test sizes; SGLang's launcher refuses them. tiny: one
model.safetensors by default; small and sglang-small: sharded with model.safetensors.index.json, grouped
so the prefill role opens only the encoder-side shards. DSpark (`mtp.*`) and Engram tensors are
included when the config has them (--backbone-only leaves them out).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from sglang_asym.checkpoint import PRECISIONS, write_checkpoint, write_tokenizer
from sglang_asym.config import V41Config

DEFAULT_SHARDS = {"tiny": 1, "small": 9, "sglang-small": 3, "sglang-tiny": 1}
DEFAULT_CONFIG = "sglang-small"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(DEFAULT_SHARDS), default=DEFAULT_CONFIG,
                        help=f"preset (default {DEFAULT_CONFIG}: a checkpoint SGLang's engine serves)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--precision", choices=PRECISIONS, default="release",
                        help="release: FP8/FP4 with e8m0 scales as published; bf16 / fp32: unquantized")
    parser.add_argument("--shards", type=int, default=None,
                        help=f"number of safetensors files (default {DEFAULT_SHARDS})")
    parser.add_argument("--backbone-only", action="store_true",
                        help="omit the non-backbone tensors (DSpark mtp.*, Engram)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    cfg = V41Config.preset(args.config)
    start = time.perf_counter()
    summary = write_checkpoint(
        args.out, cfg, args.seed,
        precision=args.precision,
        num_shards=args.shards or DEFAULT_SHARDS[args.config],
        include_extras=not args.backbone_only,
        progress=not args.quiet,
    )
    write_tokenizer(args.out, cfg)
    report = {
        "out": str(summary.directory),
        "config": args.config,
        "seed": args.seed,
        "precision": args.precision,
        "files": list(summary.files),
        "tensors": summary.tensors,
        "total_bytes": summary.total_bytes,
        "seconds": round(time.perf_counter() - start, 2),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
