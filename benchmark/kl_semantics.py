"""KL(exact || semantics) of the window positions, for every semantics: random weights or a trained checkpoint.

Random weights (default, small config): for each prompt length N and a few random prompts, the exact
full prefill's logits at the window positions [B, N) against decoder-replay, asym (single process) and
asym-exact-encoder computed split (prefill-role instance -> payload -> decode-role instance). Writes
kl_semantics_{quant}.json + a markdown table.

Trained (--checkpoint DIR, e.g. models/v41-tiny-pydoc from scripts/train_small.py): prompts are crops
of the held-out documentation text (sglang_asym.training.corpus) in the checkpoint's tokenizer; the same
prompts run on the trained weights and on random weights of the same config. Per N and semantics:
KL(exact || semantics) averaged over the window positions and prompts, and top-1 agreement (the share
of window positions whose argmax equals exact's). asym-exact-encoder equals decoder-replay (tests check
the split against it), so it is not rerun. Writes kl_semantics_trained.json + .md.

    .venv/bin/python benchmark/kl_semantics.py [--lengths 129 256 512 1024 2048] [--prompts 3]
    .venv/bin/python benchmark/kl_semantics.py --checkpoint models/v41-tiny-pydoc \
        --lengths 129 256 512 1024 2048 4096 --prompts 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from sglang_asym.asym import run_prefix, run_reference, run_window
from sglang_asym.config import V41Config
from sglang_asym.split import Semantics, SplitPlan

from kl_trained import run_trained

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))  # test/harness/
from harness.verify import Models, random_prompt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def kl_rows(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    lp, lq = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def window_logits(models: Models, prompt: torch.Tensor, semantics: Semantics, split_run: bool) -> torch.Tensor:
    split = SplitPlan(models.full.cfg, prompt.numel(), 128, semantics)
    if split_run:
        state = run_prefix(models.prefill, models.prefill.new_cache_set(), prompt, split)
        logits, cache = run_window(models.full, models.full.new_cache_set(), state, prompt, split, logits="all")
    else:
        logits, cache = run_reference(models.full, models.full.new_cache_set(), prompt, split, logits="window")
    cache.release()
    return logits


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[129, 256, 512, 1024, 2048])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-quant", choices=["none", "release"], default="none")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a trained checkpoint: held-out text prompts, trained vs random weights")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.checkpoint is not None:
        return run_trained(args, RESULTS, kl_rows)
    models = Models.build(V41Config.small(), args.seed, cache_quant=args.cache_quant)
    runs = [("decoder-replay", Semantics.DECODER_REPLAY, False), ("asym", Semantics.ASYM, False),
            ("asym-exact-encoder (split)", Semantics.ASYM_EXACT_ENCODER, True)]
    rows = []
    for n in args.lengths:
        for k in range(args.prompts):
            prompt = random_prompt(models.full.cfg, n, seed=args.seed * 100 + k)
            exact = window_logits(models, prompt, Semantics.EXACT, False)
            for name, sem, split_run in runs:
                t = time.perf_counter()
                logits = window_logits(models, prompt, sem, split_run)
                kl = kl_rows(exact, logits)
                rows.append({"N": n, "prompt": k, "semantics": name, "kl_last": float(kl[-1]),
                             "kl_window_mean": float(kl.mean()), "kl_window_max": float(kl.max()),
                             "argmax_agree_last": int(exact[-1].argmax()) == int(logits[-1].argmax()),
                             "seconds": round(time.perf_counter() - t, 2)})
                print(json.dumps(rows[-1]), flush=True)
    table = {}
    for r in rows:
        key = (r["N"], r["semantics"])
        table.setdefault(key, []).append(r)
    summary = [{"N": n, "semantics": s, "kl_last_mean": sum(x["kl_last"] for x in v) / len(v),
                "kl_window_mean": sum(x["kl_window_mean"] for x in v) / len(v),
                "kl_window_max": max(x["kl_window_max"] for x in v)} for (n, s), v in table.items()]
    command = "python " + " ".join(sys.argv)
    out = {"command": command, "config": "small", "cache_quant": args.cache_quant, "window": 128,
           "prompts_per_length": args.prompts, "summary": summary, "runs": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"kl_semantics_{args.cache_quant}.json").write_text(json.dumps(out, indent=1))
    lines = [f"# KL(exact || semantics), small config, cache quant `{args.cache_quant}`", "",
             f"Command: `{command}`", "",
             f"Mean over {args.prompts} random prompts per N; KL in nats over the window positions [N-128, N).", "",
             "| N | semantics | KL at last position | mean KL over window | max KL over window |",
             "|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['N']} | {s['semantics']} | {s['kl_last_mean']:.3e} | {s['kl_window_mean']:.3e} | "
                     f"{s['kl_window_max']:.3e} |")
    (RESULTS / f"kl_semantics_{args.cache_quant}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
