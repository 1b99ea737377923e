"""The trained-checkpoint half of kl_semantics.py: held-out text prompts, trained vs random weights, per-N table."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Tokenizer

from sglang_asym.asym import run_reference
from sglang_asym.checkpoint import random_weights, read_checkpoint_config
from sglang_asym.model import V41Model
from sglang_asym.model.loading import model_from_checkpoint
from sglang_asym.split import Semantics, SplitPlan
from sglang_asym.training.corpus import pydoc_corpus, spread_prompts, token_stream

SEMANTICS = (("decoder-replay", Semantics.DECODER_REPLAY), ("asym", Semantics.ASYM))
WINDOW = 128


def window_logits(model: V41Model, prompt: torch.Tensor, semantics: Semantics) -> torch.Tensor:
    split = SplitPlan(model.cfg, prompt.numel(), WINDOW, semantics)
    cache_set = model.new_cache_set()
    logits, cache = run_reference(model, cache_set, prompt, split, logits="window")
    cache.release()
    return logits


def measure(model: V41Model, prompts: dict[int, list[torch.Tensor]],
            kl_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> dict[str, dict[str, dict[str, float]]]:
    """{N: {semantics: {kl, top1_agreement}}}, means over every window position of every prompt."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for n, group in prompts.items():
        sums = {name: [0.0, 0, 0] for name, _ in SEMANTICS}  # kl sum, argmax agreements, positions
        t = time.perf_counter()
        for prompt in group:
            exact = window_logits(model, prompt, Semantics.EXACT)
            for name, semantics in SEMANTICS:
                logits = window_logits(model, prompt, semantics)
                sums[name][0] += float(kl_rows(exact, logits).sum())
                sums[name][1] += int((exact.argmax(-1) == logits.argmax(-1)).sum())
                sums[name][2] += exact.shape[0]
        table[str(n)] = {name: {"kl": s[0] / s[2], "top1_agreement": s[1] / s[2]} for name, s in sums.items()}
        print(json.dumps({"N": n, **table[str(n)], "seconds": round(time.perf_counter() - t, 1)}), flush=True)
    return table


def run_trained(args: argparse.Namespace, results: Path,
                kl_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> int:
    cfg = read_checkpoint_config(args.checkpoint)
    lengths = [n for n in args.lengths if n <= cfg.max_position_embeddings]
    skipped = [n for n in args.lengths if n > cfg.max_position_embeddings]
    tokenizer = Tokenizer.from_file(str(args.checkpoint / "tokenizer.json"))
    corpus = pydoc_corpus()
    stream = token_stream(tokenizer, corpus.heldout, cfg.bos_token_id)
    prompts = {n: spread_prompts(stream, n, args.prompts) for n in lengths}
    trained = model_from_checkpoint(args.checkpoint, cache_quant=args.cache_quant)
    random_model = V41Model(cfg, cache_quant=args.cache_quant)
    random_model.load_weights(random_weights(cfg, args.seed))
    print(f"trained checkpoint {args.checkpoint}", flush=True)
    trained_table = measure(trained, prompts, kl_rows)
    print(f"random weights (seed {args.seed})", flush=True)
    random_table = measure(random_model, prompts, kl_rows)
    command = "python benchmark/kl_semantics.py " + " ".join(sys.argv[1:])
    out = {"command": command, "checkpoint": str(args.checkpoint), "cache_quant": args.cache_quant,
           "window": WINDOW, "prompts_per_length": args.prompts, "heldout_tokens": stream.numel(),
           "corpus_sha256": corpus.sha256(), "lengths_skipped_over_max_positions": skipped,
           "note": "asym-exact-encoder computes decoder-replay exactly (tests), so its row is decoder-replay's",
           "trained": trained_table, "random": {"seed": args.seed, **random_table}}
    results.mkdir(exist_ok=True)
    (results / "kl_semantics_trained.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"# KL(exact || semantics) on a trained checkpoint, cache quant `{args.cache_quant}`", "",
             f"Command: `{command}`", "",
             f"{args.prompts} held-out prompts per N (crops of the held-out pydoc topics); means over the window "
             f"positions [N-{WINDOW}, N). Random: the same config and prompts, random weights (seed {args.seed}).", "",
             "| N | decoder-replay KL (trained) | top-1 agree | asym KL (trained) | top-1 agree | "
             "decoder-replay KL (random) | top-1 agree | asym KL (random) | top-1 agree |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n in lengths:
        cells = []
        for table in (trained_table, random_table):
            for name, _ in SEMANTICS:
                row = table[str(n)][name]
                cells += [f"{row['kl']:.2e}", f"{row['top1_agreement']:.3f}"]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    (results / "kl_semantics_trained.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0
