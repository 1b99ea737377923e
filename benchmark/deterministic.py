"""Deterministic inference (--enable-deterministic-inference): its step-time cost, and alone vs in-a-batch tokens.

In process: one DecodeLoop serves 8 greedy requests arriving together (held-out text prompts of 60-400
tokens, windows in 32-row chunks beside decode rows), with the mode off and on; the mean seconds of the
steps that ran decode rows only and of those mixing windows with decode rows, and the wall time.
With --servers: real servers on 127.0.0.1 (colocated `null`, and asym-prefill + asym-decode behind the
sglang-router), each with the mode off and on: one prompt's greedy tokens alone, then the same prompt
inside a concurrent batch of 8; equal or not. Writes benchmark/results/deterministic_<checkpoint name>.json.

    .venv/bin/python benchmark/deterministic.py [--checkpoint models/v41-tiny-pydoc] [--servers]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import torch
from tokenizers import Tokenizer

from sglang_asym.asym import run_prefix_on_full_model
from sglang_asym.cache import CacheSizing
from sglang_asym.model.loading import model_from_checkpoint
from sglang_asym.runtime.engine.decode_loop import ActiveRequest, DecodeLoop
from sglang_asym.runtime.engine_api import SamplingParams
from sglang_asym.sched import SchedulerConfig
from sglang_asym.split import SplitPlan
from sglang_asym.training.corpus import pydoc_corpus, token_stream

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmark" / "results"
LENGTHS = (300, 60, 140, 400, 90, 220, 180, 260)  # request 0 is the one compared alone vs in the batch


def heldout_prompts(checkpoint: Path, bos: int) -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    stream = token_stream(tokenizer, pydoc_corpus().heldout, bos).tolist()
    out, at = [], 0
    for n in LENGTHS:
        out.append([bos] + stream[at : at + n - 1])
        at += n
    return out


def serve_in_loop(model, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], list, float]:
    sizing = CacheSizing(max_requests=len(prompts) + 1, max_tokens=1024, max_chunk_tokens=128)
    cache_set = model.new_cache_set(sizing)
    tokens: dict[int, list[int]] = {}
    lock, done, finished = threading.Lock(), threading.Event(), set()

    def emitter(i):
        def emit(event):
            with lock:
                tokens.setdefault(i, []).extend(event.new_token_ids)
                if event.finished:
                    finished.add(i)
                    if len(finished) == len(prompts):
                        done.set()
        return emit

    sched = SchedulerConfig(token_budget=256, max_window_rows_per_step=256, max_running=8, num_draft_tokens=0,
                            window=128, window_chunk=32)
    steps: list = []
    loop = DecodeLoop(model, cache_set, sched, eos_token_id=-1, on_step=steps.append)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, ignore_eos=True)
    started = time.perf_counter()
    for i, p in enumerate(prompts):
        p = torch.tensor(p)
        split = SplitPlan(model.cfg, p.numel(), 128, "asym-exact-encoder")
        prefix = run_prefix_on_full_model(model, model.new_cache_set(sizing), p, split)
        loop.submit(ActiveRequest(str(i), p, split, prefix, params, emitter(i)))
    loop.start()
    try:
        if not done.wait(600):
            raise TimeoutError("decode loop did not finish")
    finally:
        loop.stop()
    return [tokens[i] for i in range(len(prompts))], steps, time.perf_counter() - started


def in_process(checkpoint: Path, new_tokens: int) -> dict:
    model = model_from_checkpoint(checkpoint, cache_quant="release")
    prompts = heldout_prompts(checkpoint, model.cfg.bos_token_id)
    out = {}
    for deterministic in (False, True):
        model.deterministic = deterministic
        alone, _, _ = serve_in_loop(model, prompts[:1], new_tokens)
        batch, steps, wall = serve_in_loop(model, prompts, new_tokens)
        decode_only = [s.seconds for s in steps if s.decode_rows and not s.window_rows]
        mixed = [s.seconds for s in steps if s.decode_rows and s.window_rows]
        out["on" if deterministic else "off"] = {
            "decode_step_ms_mean": round(1000 * statistics.mean(decode_only), 2),
            "decode_steps": len(decode_only),
            "mixed_step_ms_mean": round(1000 * statistics.mean(mixed), 2) if mixed else None,
            "mixed_steps": len(mixed), "wall_s": round(wall, 2),
            "alone_equals_in_batch": alone[0] == batch[0]}
        print(json.dumps({"deterministic": deterministic, **out["on" if deterministic else "off"]}), flush=True)
    model.deterministic = False
    out["decode_step_cost"] = round(out["on"]["decode_step_ms_mean"] / out["off"]["decode_step_ms_mean"], 2)
    return out


def generate(url: str, ids: list[int], new_tokens: int) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                  "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())["output_ids"]


def through_servers(checkpoint: Path, new_tokens: int) -> dict:
    from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess, pick_free_port
    from sglang_asym.testing.server_process import start_server, wait_healthy
    from sglang_asym.config import V41Config

    bos = V41Config.from_json_file(checkpoint).bos_token_id
    prompts = heldout_prompts(checkpoint, bos)
    logs = Path(tempfile.mkdtemp(prefix="sglang-asym-det-"))
    out = {}
    for stack in ("colocated", "pd"):
        for deterministic in (False, True):
            flags = ("--enable-deterministic-inference",) if deterministic else ()
            started, router = [], None
            try:
                if stack == "colocated":
                    server = start_server("null", checkpoint, logs, *flags)
                    started.append(server)
                    wait_healthy(server, timeout_s=300)
                    url = server.url
                else:
                    p = start_server("asym-prefill", checkpoint, logs, *flags)
                    d = start_server("asym-decode", checkpoint, logs, *flags)
                    started += [p, d]
                    for s in started:
                        wait_healthy(s, timeout_s=300)
                    router = RouterProcess(RouterConfig(prefill=(PrefillWorker(p.url, p.bootstrap_port),),
                                                        decode=(d.url,), port=pick_free_port(),
                                                        flavor=RouterFlavor("sglang_router")),
                                           log_path=logs / "router.log")
                    router.start(ready_timeout_s=120)
                    url = router.url
                alone = generate(url, prompts[0], new_tokens)
                with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                    batch = list(pool.map(lambda ids: generate(url, ids, new_tokens), prompts))
                key = f"{stack}_{'on' if deterministic else 'off'}"
                out[key] = {"alone_equals_in_batch": alone == batch[0], "alone": alone, "in_batch": batch[0]}
                print(json.dumps({key: out[key]["alone_equals_in_batch"]}), flush=True)
            finally:
                if router is not None:
                    router.stop()
                for s in started:
                    s.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "models" / "v41-tiny-pydoc")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--servers", action="store_true", help="also through real servers (colocated and P/D)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = {"command": "python benchmark/deterministic.py " + " ".join(sys.argv[1:]),
              "checkpoint": str(args.checkpoint.relative_to(ROOT) if args.checkpoint.is_relative_to(ROOT)
                                else args.checkpoint),
              "lengths": LENGTHS, "new_tokens": args.new_tokens,
              "in_process": in_process(args.checkpoint, args.new_tokens)}
    if args.servers:
        result["servers"] = through_servers(args.checkpoint, args.new_tokens)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"deterministic_{args.checkpoint.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
