"""`python -m sglang_asym.logits`: full-sequence float32 logits of a checkpoint for a [batch, seq] input.

  python -m sglang_asym.logits --model-path DIR --input-ids FILE.safetensors --key NAME \\
      --out OUT.safetensors [--cache-quant {none,release}]

Each row of the int64 tensor NAME is one sequence run from position 0; the output tensor `logits`
has shape [batch, seq, vocab]."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .checkpoint import CheckpointError
from .config import ConfigError
from .formats import CACHE_QUANT_MODES
from .model import InvalidInput
from .model.loading import model_from_checkpoint


def compute_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    if input_ids.ndim != 2 or input_ids.dtype not in (torch.int64, torch.int32):
        raise InvalidInput(f"input ids must be an integer [batch, seq] tensor, got {tuple(input_ids.shape)} "
                           f"{input_ids.dtype}")
    if input_ids.shape[0] == 0:
        raise InvalidInput("input ids hold no sequence (batch of 0)")
    cache_set = model.new_cache_set()
    rows = []
    for row in input_ids:
        cache = cache_set.new_request()
        try:
            rows.append(model(row, cache, logits="all").float())
        finally:
            cache.release()
    return torch.stack(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_asym.logits", description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True, type=Path)
    parser.add_argument("--input-ids", required=True, type=Path)
    parser.add_argument("--key", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--cache-quant", choices=list(CACHE_QUANT_MODES), default="none")
    args = parser.parse_args(argv)
    try:
        inputs = load_file(str(args.input_ids))
    except (FileNotFoundError, SafetensorError, OSError) as exc:
        print(f"error: cannot read {args.input_ids}: {exc}", file=sys.stderr)
        return 2
    if args.key not in inputs:
        print(f"error: {args.input_ids} has no tensor {args.key!r} (has {sorted(inputs)})", file=sys.stderr)
        return 2
    try:
        model = model_from_checkpoint(args.model_path, cache_quant=args.cache_quant)
        logits = compute_logits(model, inputs[args.key])
    except (CheckpointError, ConfigError, InvalidInput, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    save_file({"logits": logits.contiguous()}, str(args.out))
    print(f"wrote logits {tuple(logits.shape)} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
