"""The step-time cost of `--enable-deterministic-inference` in SGLang's own engine on CPU, off and on side by side.

Default (in process): the forward SGLang's engine runs on CPU (`ReferenceForward.run_rows`, the reference
V4.1 over a pool; here an in-memory row store in the pool's release formats, the unit test's) on the
small random V4.1 at SGLang's pool geometry, flag off and on alternating for --rounds rounds: one extend
batch of 8 prompts (140, 130, 3, 9, 1, 17, 5, 200 tokens: windows among them, in their pieces) and
--new-tokens decode steps at 8 requests; mean seconds of each, the on / off ratios, and whether the first
request's logits alone equal those in the batch, bit for bit.

With --servers: starts the flag-off and flag-on stacks together (the colocated `null` server; with --pair also asym-prefill +
asym-decode behind sglang-router), all on the small generated checkpoint SGLang's tests use, and runs the
same work on each in turn, alternating off / on for --rounds rounds so both see the same machine load: one
greedy target prompt alone, then the target inside 8 concurrent requests (short prompts and windows). The
reference forward's log (SGLANG_ASYM_FORWARD_LOG) gives every forward's wall time: the mean of the decode
forwards at 8 rows and of the extend forwards (prompts on the colocated server, window steps on D), per
stack and flag, and their on / off ratios. Also records whether the target's tokens alone equal those in
the batch. Writes benchmark/results/deterministic_sglang_engine.json.

    .venv/bin/python benchmark/deterministic_sglang_engine.py [--rounds 3] [--new-tokens 3]
    .venv/bin/python benchmark/deterministic_sglang_engine.py --servers [--pair] [--rounds 2] [--new-tokens 8]
On a loaded 2-core machine a flag-on batch of 8 can outlast SGLang's 300 s watchdog (--watchdog-timeout).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))

from system.helpers import serving  # noqa: E402
from system.sglang_servers import (forward_log, greedy, greedy_together, patient_router, prompt_of,  # noqa: E402
                                   sglang_server, write_sglang_checkpoint)

from harness.router_launch import RouterFlavor  # noqa: E402

RESULTS = ROOT / "benchmark" / "results"
FLAG = "--enable-deterministic-inference"
TARGET = 140
OTHERS = (130, 3, 9, 1, 17, 5, 200)  # with the target: 8 requests, three of them windows (N > W = 128)


def summarize(lines: list[dict]) -> dict:
    decode8 = [f["seconds"] for f in lines if f["mode"] == "decode" and len(f["rows"]) == 8]
    extend = [f["seconds"] for f in lines if f["mode"] == "extend"]
    extend_rows = [sum(end - start for _, start, end in f["rows"]) for f in lines if f["mode"] == "extend"]
    return {"decode_forwards_at_8": len(decode8), "decode_step_at_8_s": statistics.mean(decode8) if decode8 else None,
            "extend_forwards": len(extend), "extend_forward_s": statistics.mean(extend) if extend else None,
            "extend_rows_per_forward": statistics.mean(extend_rows) if extend_rows else None}


def measure(name: str, bases: dict[str, str], logs: dict[str, Path], rounds: int, new_tokens: int) -> dict:
    target, others = prompt_of(TARGET), [prompt_of(n) for n in OTHERS]
    lines: dict[str, list[dict]] = {"off": [], "on": []}
    equal: dict[str, list[bool]] = {"off": [], "on": []}
    for r in range(rounds):
        for flag in ("off", "on"):
            alone = greedy(bases[flag], target, new_tokens, ignore_eos=True)
            logs[flag].unlink(missing_ok=True)
            started = time.perf_counter()
            batched = greedy_together(bases[flag], [target, *others], new_tokens)[0]
            wall = time.perf_counter() - started
            lines[flag] += forward_log(logs[flag])
            equal[flag].append(batched == alone)
            print(f"{name} round {r} flag {flag}: batch of 8 in {wall:.1f} s, alone == batched: {batched == alone}",
                  flush=True)
    out = {flag: {**summarize(lines[flag]), "alone_equals_batched": equal[flag]} for flag in ("off", "on")}
    report_on_over_off(name, out, ("decode_step_at_8_s", "extend_forward_s"))
    return out


def report_on_over_off(name: str, out: dict, keys: tuple[str, ...]) -> None:
    """Adds out["ratio_on_over_off"] (flag on over off, per key; None where a side measured nothing) and prints it."""
    ratios = {key: round(out["on"][key] / out["off"][key], 2) if out["on"][key] and out["off"][key] else None
              for key in keys}
    out["ratio_on_over_off"] = ratios
    print(f"{name}: " + "; ".join(f"{key} off {out['off'][key]} s, on {out['on'][key]} s (x{ratios[key]})"
                                  for key in keys), flush=True)


def in_process(rounds: int, new_tokens: int, preset: str) -> dict:
    import torch

    from sglang_plugin.test_reference_forward_deterministic import MemoryRows

    from sglang_asym.checkpoint.random_init import random_weights
    from sglang_asym.model import V41Model
    from sglang_asym.sglang_plugin.cpu_platform.reference_forward import DEFAULT_SEMANTICS, RequestRows
    from sglang_plugin.whole_forward import ReferenceForward
    from harness.sglang_shapes import sglang_small

    from sglang_asym.config import V41Config

    cfg = sglang_small() if preset == "sglang_small" else V41Config.preset(preset)
    model = V41Model(cfg, cache_quant="release")
    weights = random_weights(cfg, 11)
    model.load_weights({k: v for k, v in weights.items() if k in model.expected_tensor_names()})
    prompts = [torch.tensor(prompt_of(n)) % cfg.vocab_size for n in (TARGET, *OTHERS)]

    def serve(deterministic: bool, batched: bool) -> tuple[list[torch.Tensor], float, list[float]]:
        forward = ReferenceForward(model, MemoryRows(cfg), DEFAULT_SEMANTICS, deterministic)
        mine = prompts if batched else prompts[:1]
        started = time.perf_counter()
        logits, _ = forward.run_rows([RequestRows(i, 0, p, p.numel()) for i, p in enumerate(mine)])
        extend_s, steps, seen = time.perf_counter() - started, [], [logits[0]]
        for step in range(new_tokens):
            rows = [RequestRows(i, p.numel() + step, torch.tensor([int(out.argmax())]), None)
                    for i, (p, out) in enumerate(zip(mine, logits))]
            started = time.perf_counter()
            logits, _ = forward.run_rows(rows)
            steps.append(time.perf_counter() - started)
            seen.append(logits[0])
        return seen, extend_s, steps

    out: dict = {flag: {"extend_batch_of_8_s": [], "decode_step_at_8_s": [], "alone_equals_batched": []}
                 for flag in ("off", "on")}
    with torch.no_grad():
        for r in range(rounds):
            for flag in ("off", "on"):
                alone, _, _ = serve(flag == "on", False)
                batched, extend_s, steps = serve(flag == "on", True)
                same = all(torch.equal(a, b) for a, b in zip(alone, batched))
                out[flag]["extend_batch_of_8_s"].append(extend_s)
                out[flag]["decode_step_at_8_s"] += steps
                out[flag]["alone_equals_batched"].append(same)
                print(f"round {r} flag {flag}: extend of 8 prompts {extend_s:.2f} s, decode step at 8 "
                      f"{statistics.mean(steps):.3f} s, target logits alone == batched: {same}", flush=True)
    for flag in ("off", "on"):
        for key in ("extend_batch_of_8_s", "decode_step_at_8_s"):
            out[flag][key] = round(statistics.mean(out[flag][key]), 4)
    report_on_over_off("in-process", out, ("extend_batch_of_8_s", "decode_step_at_8_s"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", action="store_true", help="real servers instead of the in-process forward")
    parser.add_argument("--pair", action="store_true", help="with --servers: also the asym pair behind sglang-router")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preset", default="sglang_small", choices=("sglang_small", "tiny"),
                        help="in process: the model (tiny: the 9-layer preset, for a loaded machine)")
    parser.add_argument("--new-tokens", type=int, default=3)
    args = parser.parse_args()
    results: dict = {"command": "python benchmark/" + Path(__file__).name + " " + " ".join(sys.argv[1:]),
                     "checkpoint": "sglang_shapes.sglang_small(), seed 11, release precision (the SGLang-engine tests')",
                     "target_prompt": TARGET, "others": list(OTHERS), "new_tokens": args.new_tokens,
                     "rounds": args.rounds, "machine": "2 CPU cores, shared (the off and on runs alternate)"}
    if not args.servers:
        results["checkpoint"] = (f"{args.preset} (sglang_small: SGLang's pool geometry), random weights seed 11, "
                                 "release cache formats, built in process")
        results["in_process_reference_forward"] = in_process(args.rounds, args.new_tokens, args.preset)
        write(results)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        checkpoint = write_sglang_checkpoint(work / "ckpt")
        (work / "logs").mkdir()

        def start(mode: str, role: str, flag: str, *extra: str):
            return sglang_server(mode, checkpoint, work / "logs", *extra,
                                 env={"SGLANG_ASYM_FORWARD_LOG": str(work / f"{role}-{flag}.jsonl")})

        servers = {f"colocated-{flag}": start("null", "colocated", flag, *((FLAG,) if flag == "on" else ()))
                   for flag in ("off", "on")}
        with serving(servers, timeout_s=900):
            results["colocated"] = measure("colocated", {f: servers[f"colocated-{f}"].url for f in ("off", "on")},
                                           {f: work / f"colocated-{f}.jsonl" for f in ("off", "on")},
                                           args.rounds, args.new_tokens)
        if args.pair:
            pair = {}
            for flag in ("off", "on"):
                extra = (FLAG,) if flag == "on" else ()
                pair[f"prefill-{flag}"] = start("asym-prefill", "prefill", flag, *extra)
                pair[f"decode-{flag}"] = start("asym-decode", "decode", flag, *extra)
            with serving(pair, timeout_s=900), \
                    patient_router(pair["prefill-off"], pair["decode-off"], RouterFlavor.SGLANG_ROUTER) as off, \
                    patient_router(pair["prefill-on"], pair["decode-on"], RouterFlavor.SGLANG_ROUTER) as on:
                results["pair_decode_worker"] = measure("pair (D's forwards)", {"off": off.url, "on": on.url},
                                                        {f: work / f"decode-{f}.jsonl" for f in ("off", "on")},
                                                        args.rounds, args.new_tokens)
    write(results)


def write(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "deterministic_sglang_engine.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
