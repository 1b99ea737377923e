#!/usr/bin/env python
"""Distill the DSpark drafter (`mtp.*`) on CPU against the target's own greedy continuations.

    scripts/distill_drafter.py --config tiny --seed 0 --steps 300 --out /tmp/dspark-tiny.safetensors
    scripts/distill_drafter.py --model-path DIR --seed 0 --steps 300 --out FILE.safetensors

Data: random prompts (lengths up to twice the window), each continued greedily by the target; one
full forward over prompt + continuation gives the drafter's features at every position and the
target's next-token distribution at every position. Training: for anchors sampled in the continuation,
the drafter's block over that anchor minimizes KL(target || draft) at each slot (previous tokens
teacher-forced, as the accepted prefix is the target's own tokens). Acceptance is measured before
and after with greedy speculative decoding on held-out prompts; one JSON line is printed.
The drafter starts from the checkpoint's mtp.* tensors when --model-path has them, else from random
weights of --seed. The output holds the mtp.* tensors (fp32) under their released names.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from sglang_asym.checkpoint import CheckpointReader, load_weights, random_weights
from sglang_asym.config import V41Config
from sglang_asym.model import V41Model
from sglang_asym.model.dspark import DSparkDrafter, random_drafter_weights
from sglang_asym.model.loading import model_from_checkpoint
from sglang_asym.model.steps import greedy_continue
from sglang_asym.speculative import AcceptanceStats, GREEDY, SpecRequest, generate, prefill_for_drafting, sample_token


@dataclass(frozen=True)
class Sequence:
    tokens: torch.Tensor  # [T] prompt + greedy continuation
    prompt_len: int
    features: torch.Tensor  # [T, n * hidden] drafter features at every position
    target_logp: torch.Tensor  # [T, V] log-probabilities of the target's next token


def build_models(args: argparse.Namespace) -> tuple[V41Model, DSparkDrafter, str]:
    if args.model_path:
        target = model_from_checkpoint(args.model_path)
        drafter = DSparkDrafter(target)
        names = drafter.expected_tensor_names()
        if names <= set(CheckpointReader(args.model_path).weight_map):
            drafter.load_weights(load_weights(args.model_path, names, progress=False))
            return target, drafter, "checkpoint"
    else:
        cfg = V41Config.preset(args.config)
        target = V41Model(cfg)
        target.load_weights(random_weights(cfg, args.seed))
        drafter = DSparkDrafter(target)
    drafter.load_weights(random_drafter_weights(target.cfg, args.seed))
    return target, drafter, "random"


def random_prompt(cfg: V41Config, rng: torch.Generator) -> torch.Tensor:
    n = int(torch.randint(8, 2 * cfg.sliding_window + 1, (), generator=rng))
    return torch.randint(0, cfg.vocab_size, (n,), generator=rng)


def make_sequence(target: V41Model, drafter: DSparkDrafter, prompt: torch.Tensor, new_tokens: int) -> Sequence:
    cache_set = target.new_cache_set()
    cache = cache_set.new_request()
    continuation, _ = greedy_continue(target, cache, target(prompt, cache), new_tokens)
    cache.release()
    tokens = torch.cat((prompt, torch.tensor(continuation)))
    cache = cache_set.new_request()
    logits = target(tokens, cache, logits="all", capture=drafter.feature_layers)
    features = torch.cat([target.captured[layer] for layer in drafter.feature_layers], dim=-1)
    cache.release()
    return Sequence(tokens, prompt.numel(), features.float(), torch.log_softmax(logits.float(), -1))


def measure_acceptance(target: V41Model, drafter: DSparkDrafter, prompts: list[torch.Tensor], new_tokens: int,
                       k: int) -> AcceptanceStats:
    total = AcceptanceStats()
    cache_set = target.new_cache_set()
    for prompt in prompts:
        cache = cache_set.new_request()
        logits, state = prefill_for_drafting(target, drafter, cache, prompt)
        req = SpecRequest(cache, state, sample_token(logits, GREEDY))
        generate(target, drafter, req, new_tokens - 1, k)
        total.merge(req.stats)
        cache.release()
    return total


def distill_loss(drafter: DSparkDrafter, seq: Sequence, anchors: torch.Tensor) -> torch.Tensor:
    """Mean KL(target || draft) over the valid slots of the blocks at `anchors`."""
    cfg = drafter.cfg
    window, size = cfg.sliding_window, cfg.dspark_block_size
    total = seq.tokens.numel()
    rows = drafter.context_rows(seq.features, torch.arange(total))  # [blocks, T, head_dim]
    index = anchors.unsqueeze(1) - window + torch.arange(window)  # context positions [a - W, a)
    context = rows[:, index.clamp(min=0)]
    normed = drafter.hidden(seq.tokens[anchors], anchors, context, index >= 0)
    slot_rows = anchors.unsqueeze(1) + torch.arange(size)  # target row a + j predicts position a + j + 1
    valid = slot_rows < total
    slot_rows = slot_rows.clamp(max=total - 1)
    previous = seq.tokens[slot_rows]  # slot j follows token a + j (the anchor, then accepted tokens)
    draft_logp = torch.log_softmax(drafter.vocab_logits(normed) + drafter.transition(previous)[0], -1)
    target_logp = seq.target_logp[slot_rows]
    kl = (target_logp.exp() * (target_logp - draft_logp)).sum(-1)
    return (kl * valid).sum() / valid.sum()


def train(drafter: DSparkDrafter, data: list[Sequence], steps: int, anchors_per_step: int, lr: float,
          rng: torch.Generator, log_every: int) -> list[float]:
    drafter.requires_grad_(True)
    optimizer = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps, eta_min=lr / 20)
    losses = []
    for step in range(steps):
        seq = data[step % len(data)]
        anchors = torch.randint(seq.prompt_len, seq.tokens.numel(), (anchors_per_step,), generator=rng)
        loss = distill_loss(drafter, seq, anchors)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}  KL {losses[-1]:.4f}", file=sys.stderr, flush=True)
    drafter.requires_grad_(False)
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-path", help="checkpoint directory (config.json + safetensors)")
    source.add_argument("--config", choices=["tiny", "small"], help="preset with random weights of --seed")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps")
    parser.add_argument("--out", required=True, help="output .safetensors with the mtp.* tensors")
    parser.add_argument("--train-prompts", type=int, default=24)
    parser.add_argument("--eval-prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48, help="greedy continuation per prompt")
    parser.add_argument("--anchors", type=int, default=16, help="draft blocks per optimizer step")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam, cosine-decayed to lr/20")
    parser.add_argument("--k", type=int, default=None, help="draft tokens per step when measuring "
                        "(default dspark_block_size)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    for name in ("steps", "train_prompts", "eval_prompts", "new_tokens", "anchors"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.out.endswith(".safetensors"):
        parser.error("--out must be a .safetensors file")
    if args.threads:
        torch.set_num_threads(args.threads)

    start = time.perf_counter()
    torch.manual_seed(args.seed)
    target, drafter, init = build_models(args)
    cfg = target.cfg
    k = args.k or cfg.dspark_block_size
    if not 1 <= k <= cfg.dspark_block_size:
        parser.error(f"--k must be in [1, {cfg.dspark_block_size}] (dspark_block_size)")
    train_rng = torch.Generator().manual_seed(args.seed)
    eval_rng = torch.Generator().manual_seed(args.seed + 1_000_003)  # held-out prompts
    data = [make_sequence(target, drafter, random_prompt(cfg, train_rng), args.new_tokens)
            for _ in range(args.train_prompts)]
    held_out = [random_prompt(cfg, eval_rng) for _ in range(args.eval_prompts)]
    data_seconds = time.perf_counter() - start

    before = measure_acceptance(target, drafter, held_out, args.new_tokens, k)
    losses = train(drafter, data, args.steps, args.anchors, args.lr, train_rng, max(1, args.steps // 10))
    after = measure_acceptance(target, drafter, held_out, args.new_tokens, k)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({name: t.detach().float().contiguous() for name, t in drafter.state_dict().items()}, str(out),
              metadata={"config_fingerprint": cfg.fingerprint(), "seed": str(args.seed), "steps": str(args.steps),
                        "init": init})
    print(json.dumps({
        "config": args.config or args.model_path,
        "seed": args.seed,
        "steps": args.steps,
        "init": init,
        "k": k,
        "train_sequences": len(data),
        "held_out_prompts": len(held_out),
        "new_tokens": args.new_tokens,
        "kl_first": round(losses[0], 4),
        "kl_last": round(sum(losses[-10:]) / len(losses[-10:]), 4),
        "acceptance_before": before.as_dict(),
        "acceptance_after": after.as_dict(),
        "out": str(out),
        "tensors": len(drafter.state_dict()),
        "data_seconds": round(data_seconds, 1),
        "seconds": round(time.perf_counter() - start, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
