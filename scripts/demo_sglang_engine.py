"""The mission's command line on 127.0.0.1: `python -m sglang.launch_server --device cpu
--disaggregation-mode asym-prefill` and `asym-decode` (SGLang 0.5.23's own server with this plugin)
behind the real sglang-router, in two parts, each a pair of its own:
1. the small V4.1 (the real 40-layer schedule at SGLang's pool geometry, random weights: its text is noise)
   answering prompts shorter than W, exactly W and longer. Prints what P and D computed (P: the encoder
   layers and the last KV source's KV path over [0, N - W); D: every layer over the last W rows, then
   decode), TTFT, the bytes SGLang's sender moved and the P and D memory;
2. the trained tiny model (models/v41-sglang-tiny-pydoc, nine layers at SGLang's pool geometry, trained on
   Python's documentation) answering text prompts, short and longer than W: its greedy text and a sampled
   continuation (temperature 0.6, a fixed seed; greedy decoding of so small a model falls into loops).
Every greedy output must equal the tokens of the in-process reference model computing the pair's pieces
(P's prefix [0, B) in the prefill chunks, D's window [B, N) in its window chunks with the semantics'
floors); the demo fails otherwise. It stops everything it started.

    .venv/bin/python scripts/demo_sglang_engine.py [--checkpoint DIR] [--trained DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))  # test/harness/
from harness.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess  # noqa: E402
from harness.pair_reference import pair_greedy  # noqa: E402
from harness.server_process import start_server, wait_healthy  # noqa: E402


ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "models" / "v41-sglang-tiny-pydoc"
TEXT_PROMPTS = (  # the second is longer than W tokens: P computes its prefix
    "The return statement",
    "The try statement specifies exception handlers and/or cleanup code for a group of statements. When an "
    "exception occurs in the try clause, the search for an exception handler is started. This search inspects "
    "the except clauses in turn until one is found that matches the exception. An expression-less except "
    "clause, if present, must be last; it matches any exception. For an except clause with an expression, "
    "that expression is evaluated, and the clause matches the exception if the resulting object is "
    "compatible with the exception. If no except clause matches the exception, the search continues in the "
    "surrounding code and on the invocation stack. The",
)
TEXT_TOKENS = 24
SAMPLING = {"temperature": 0.6, "sampling_seed": 7}
W = 128
LENGTHS = (("shorter than W", 60), ("exactly W", 128), ("long", 700))
NEW_TOKENS = 12
PREFILL_CHUNK = 512  # P's chunked prefill: the reference runs the prefix in the same chunks
SEMANTICS = "asym-exact-encoder"  # --asym-semantics' default


def prompt(n: int) -> list[int]:
    return [(n * 7919 + i * 104729) % 700 + 3 for i in range(n)]


def stream_generate(url: str, body: dict) -> tuple[dict, float, list[float]]:
    """POST /generate with stream=true: the last event, TTFT and the gaps between chunks (seconds)."""
    req = urllib.request.Request(url + "/generate", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    start, stamps, last = time.perf_counter(), [], None
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                last = json.loads(line[5:])
                stamps.append(time.perf_counter())
    return last, stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])]


def rss_mb(pid: int) -> float:
    """Resident memory of a server and its children (SGLang runs its scheduler in a child process)."""
    import psutil

    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def forwards(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def transfer_mb(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("sglang:kv_transfer_total_mb_sum"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@contextlib.contextmanager
def serving_pair(checkpoint: Path, work: Path) -> Iterator[tuple[dict, RouterProcess, dict]]:
    """P and D on `checkpoint` (each logging its forwards) and sglang-router in front; all stopped after."""
    logs = {role: work / f"{role}.jsonl" for role in ("prefill", "decode")}
    env = {"SGLANG_PLUGINS": "sglang_asym"}
    flags = ("--device", "cpu", "--enable-metrics", "--chunked-prefill-size", str(PREFILL_CHUNK))
    print(f"[demo] starting on {checkpoint.name}: python -m sglang.launch_server --device cpu --disaggregation-mode "
          "asym-prefill / asym-decode and sglang-router in front of them", flush=True)
    servers = {
        "P": start_server("asym-prefill", checkpoint, work, *flags,
                          module="sglang.launch_server", env={**env, "SGLANG_ASYM_FORWARD_LOG": str(logs["prefill"])}),
        "D": start_server("asym-decode", checkpoint, work, *flags,
                          module="sglang.launch_server", env={**env, "SGLANG_ASYM_FORWARD_LOG": str(logs["decode"])}),
    }
    router = None
    try:
        for server in servers.values():
            wait_healthy(server, timeout_s=900)
        print(f"[demo] memory after loading: P {rss_mb(servers['P'].proc.pid):.0f} MB, "
              f"D {rss_mb(servers['D'].proc.pid):.0f} MB (P holds the encoder and the last KV source's KV path only)")
        router = RouterProcess(RouterConfig(
            prefill=(PrefillWorker(servers["P"].url, servers["P"].bootstrap_port),), decode=(servers["D"].url,),
            flavor=RouterFlavor.SGLANG_ROUTER, retry_max_retries=1,
            extra_args=("--disable-circuit-breaker", "--health-check-timeout-secs", "60",
                        "--health-failure-threshold", "10")))
        router.start(ready_timeout_s=180)
        yield servers, router, logs
    finally:
        if router is not None:
            router.stop()
        for server in servers.values():
            server.stop()


def layer_words(checkpoint: Path) -> tuple[str, str]:
    """What P and D compute, in layers of this checkpoint's config."""
    from sglang_asym.config import V41Config
    from sglang_asym.sglang_plugin.prefill.role import PrefillRole

    cfg = V41Config.from_json_file(checkpoint)
    last = PrefillRole.from_config(cfg).last_kv_source
    return (f"layers 0-{last - 1} + layer {last}'s KV path", f"all {cfg.num_hidden_layers} layers")


def random_weights_part(checkpoint: Path, work: Path) -> int:
    """Part 1: token prompts around W on the small model; returns how many outputs differ from the reference."""
    from sglang_asym.model.loading import model_from_checkpoint

    reference = model_from_checkpoint(checkpoint, cache_quant="release")  # SGLang's v41 pool formats
    p_words, d_words = layer_words(checkpoint)
    failures = 0
    with serving_pair(checkpoint, work) as (servers, router, logs):
        for label, n in LENGTHS:
            for path in logs.values():
                path.unlink(missing_ok=True)
            # ignore_eos: the reference decodes NEW_TOKENS too
            body = {"input_ids": prompt(n), "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0,
                                                                "ignore_eos": True}}
            mb = transfer_mb(servers["P"].url)
            last, ttft, gaps = stream_generate(router.url, body)
            moved = transfer_mb(servers["P"].url) - mb
            same = last["output_ids"] == pair_greedy(reference, prompt(n), PREFILL_CHUNK, SEMANTICS, NEW_TOKENS)
            failures += not same
            p_rows = [(s, e) for f in forwards(logs["prefill"]) for room, s, e in f["rows"] if room]
            d_window = [(s, e) for f in forwards(logs["decode"]) if f["mode"] == "extend"
                        for room, s, e in f["rows"] if room]
            print(f"== {label}: N={n}, B=N-W={max(n - W, 0)}")
            print(f"   P computed {p_rows or 'nothing (N <= W: no forward)'} through {p_words}")
            print(f"   D computed the window {d_window} through {d_words}, then decoded")
            print(f"   output ids {last['output_ids']}")
            print(f"   equal to the in-process reference model: {same}; TTFT {1000 * ttft:.0f} ms, "
                  f"mean ITL {1000 * sum(gaps) / max(len(gaps), 1):.0f} ms; SGLang's sender moved {moved:.3f} MB")
    return failures


def trained_part(checkpoint: Path, work: Path) -> int:
    """Part 2: text prompts on the trained tiny model; returns how many greedy outputs differ from the reference."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from sglang_asym.model.loading import model_from_checkpoint

    reference = model_from_checkpoint(checkpoint, cache_quant="release")
    transformers_logging.set_verbosity_error()  # it names the unknown model type once; the tokenizer is plain BPE
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)  # as SGLang's tokenizer manager loads it
    p_words, _ = layer_words(checkpoint)
    failures = 0
    with serving_pair(checkpoint, work) as (_, router, _):
        for text in TEXT_PROMPTS:
            ids = tokenizer(text)["input_ids"]
            greedy_body = {"input_ids": ids, "sampling_params": {"max_new_tokens": TEXT_TOKENS, "temperature": 0}}
            greedy, _, _ = stream_generate(router.url, greedy_body)
            expected = pair_greedy(reference, ids, PREFILL_CHUNK, SEMANTICS, len(greedy["output_ids"]))
            same = greedy["output_ids"] == expected
            failures += not same
            sampled, _, _ = stream_generate(router.url, {"input_ids": ids, "sampling_params": {
                "max_new_tokens": TEXT_TOKENS, **SAMPLING}})
            shown = text if len(text) < 60 else "..." + text[-50:]
            split = f"P computed the first {len(ids) - W} through {p_words}" if len(ids) > W else "N <= W: D alone"
            print(f"== {len(ids)} tokens ({split}): {shown!r}")
            print(f"   greedy : {greedy['text']!r} (equal to the in-process reference model: {same})")
            print(f"   sampled: {sampled['text']!r} (temperature {SAMPLING['temperature']}, "
                  f"seed {SAMPLING['sampling_seed']})")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="part 1's model (default: a fresh small one)")
    parser.add_argument("--trained", type=Path, default=TRAINED, help="part 2's model")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="demo_sglang_") as tmp:
        work = Path(tmp)
        checkpoint = args.checkpoint
        if checkpoint is None:
            from system.sglang_servers import write_sglang_checkpoint

            print("[demo] part 1: writing a small V4.1 checkpoint at SGLang's pool geometry (random weights)",
                  flush=True)
            checkpoint = write_sglang_checkpoint(work / "ckpt")
        (work / "part1").mkdir()
        (work / "part2").mkdir()
        failures = random_weights_part(checkpoint, work / "part1")
        print(f"[demo] part 2: the trained tiny model ({args.trained}) answers text through the same command line",
              flush=True)
        failures += trained_part(args.trained, work / "part2")
    print("[demo] SGLang's engine served the asymmetric pair " +
          ("with the reference model's tokens" if not failures else f"with {failures} mismatching outputs"))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
