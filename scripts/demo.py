"""The main job: the real router in front of an asym-prefill and an asym-decode server on 127.0.0.1,
serving the trained tiny V4.1 checkpoint (models/v41-tiny-pydoc, trained on Python's documentation by
scripts/train_small.py); prompts shorter than W, exactly W and long, taken from the held-out text;
prints the outputs next to a colocated (`null`) server's for the same prompts (they must be equal),
what P computed and shipped, TTFT, ITL and the P and D memory; stops everything it started.

    .venv/bin/python scripts/demo.py [--checkpoint DIR] [--router sglang_router|smg]

Another checkpoint (e.g. scripts/make_checkpoint.py --config small) works the same way; its prompts
are then tokenized with its own tokenizer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tokenizers import Tokenizer

from sglang_asym.config import V41Config
from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess, pick_free_port
from sglang_asym.testing.server_process import start_server, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "models" / "v41-tiny-pydoc"
W = 128
SHORT_PROMPT = "The return statement"
LONG_CHARS = 3000
# Seeded sampling: a 1M-parameter model's greedy text falls into loops; the split and the colocated
# reference draw the same tokens from the same seed.
SAMPLING = {"temperature": 0.6, "sampling_seed": 7}


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
    ttft = stamps[0] - start
    return last, ttft, [b - a for a, b in zip(stamps, stamps[1:])]


def prose_paragraphs() -> list[str]:
    """Held-out paragraphs (never trained on) that are prose: no grammar rules, code or tables."""
    from sglang_asym.training.corpus import pydoc_corpus

    out = []
    for text in pydoc_corpus().heldout:
        for paragraph in text.split("\n\n"):
            words = " ".join(paragraph.split())
            letters = sum(c.isalpha() or c == " " for c in words)
            if words[:1].isupper() and ">>>" not in words and "::=" not in words and letters > 0.9 * len(words):
                out.append(words)
    return out


def demo_prompts(checkpoint: Path) -> list[tuple[str, dict]]:
    """Shorter than W (text), exactly W token ids and a long prompt (ending at a full stop), from held-out prose."""
    bos = V41Config.from_json_file(checkpoint).bos_token_id
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    prose = prose_paragraphs()
    exact_w = [bos] + tokenizer.encode(" ".join(prose[:4]), add_special_tokens=False).ids[: W - 1]
    long_text = " ".join(prose[4:])[:LONG_CHARS]
    return [("shorter than W", {"text": SHORT_PROMPT}),
            ("exactly W tokens", {"input_ids": exact_w}),
            ("long prompt", {"text": long_text[: long_text.rindex(". ") + 1]})]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, default=TRAINED)
    parser.add_argument("--router", choices=[f.value for f in RouterFlavor], default="sglang_router")
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").exists():
        print(f"[demo] training the tiny V4.1 checkpoint into {args.checkpoint}", flush=True)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "train_small.py"), "--out", str(args.checkpoint)],
                       check=True)
    logs = Path(tempfile.mkdtemp(prefix="sglang-asym-demo-"))
    started = []
    router = None
    try:
        p = start_server("asym-prefill", args.checkpoint, logs)
        d = start_server("asym-decode", args.checkpoint, logs)
        colocated = start_server("null", args.checkpoint, logs)
        started += [p, d, colocated]
        for server in started:
            wait_healthy(server, timeout_s=300)
        router = RouterProcess(RouterConfig(prefill=(PrefillWorker(p.url, p.bootstrap_port),), decode=(d.url,),
                                            port=pick_free_port(), flavor=RouterFlavor(args.router)),
                               log_path=logs / "router.log")
        router.start(ready_timeout_s=120)
        print(f"[demo] router {router.url} -> P {p.url} (bootstrap {p.bootstrap_port}), D {d.url}; "
              f"colocated reference {colocated.url}; logs in {logs}")
        print(f"[demo] memory after loading: P {p.rss_mb():.0f} MB, D {d.rss_mb():.0f} MB "
              f"(P holds the encoder + the last KV source's path only)\n")
        mismatches = 0
        for label, prompt in demo_prompts(args.checkpoint):
            body = {**prompt, "sampling_params": {"max_new_tokens": args.new_tokens, **SAMPLING}}
            last, ttft, gaps = stream_generate(router.url, body)
            reference, _, _ = stream_generate(colocated.url, body)
            meta = last["meta_info"]
            n = meta["prompt_tokens"]
            b = max(n - W, 0)
            itl = sum(gaps) / len(gaps) if gaps else float("nan")
            print(f"== {label}: N={n} prompt tokens; P computed [0, {b}), D computed [{b}, {n}) then decoded")
            text = prompt.get("text") or Tokenizer.from_file(str(args.checkpoint / "tokenizer.json")).decode(
                prompt["input_ids"], skip_special_tokens=True)
            print(f"   prompt: {text if len(text) < 90 else '...' + text[-90:]!r}")
            print(f"   output: {last['text']!r}")
            same = "equal" if last["text"] == reference["text"] else f"DIFFERENT: {reference['text']!r}"
            mismatches += last["text"] != reference["text"]
            print(f"   colocated reference output: {same}")
            print(f"   TTFT {1000 * ttft:.0f} ms, mean ITL {1000 * itl:.0f} ms over {len(gaps)} gaps, "
                  f"finish {meta['finish_reason']}")
        for name, server in (("P", p), ("D", d)):
            metrics = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
            moved = [line for line in metrics.splitlines()
                     if line.startswith(("sglang_asym:kv_transfer_bytes_sum", "sglang_asym:kv_transfer_bytes_count",
                                         "sglang_asym:window_step_tokens_total"))]
            print(f"[demo] {name} metrics: " + "; ".join(m.split("{")[0] + " " + m.split()[-1] for m in moved))
        print(f"[demo] memory at the end: P {p.rss_mb():.0f} MB, D {d.rss_mb():.0f} MB")
        return 1 if mismatches else 0
    finally:
        if router is not None:
            router.stop()
        for server in started:
            server.stop()
        print("[demo] stopped router, P, D and the colocated server")


if __name__ == "__main__":
    sys.exit(main())
