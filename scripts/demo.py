"""The main job: the real router in front of an asym-prefill and an asym-decode server on 127.0.0.1,
serving the small V4.1 checkpoint; prompts shorter than W, exactly W and long; prints the outputs,
what P computed and shipped, TTFT, ITL and the P and D memory; stops everything it started.

    .venv/bin/python scripts/demo.py [--checkpoint DIR] [--router sglang_router|smg]
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

from sglang_asym.runtime.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess, pick_free_port
from sglang_asym.runtime.server_process import start_server, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
W = 128


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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "work-tmp" / "v41-small")
    parser.add_argument("--router", choices=[f.value for f in RouterFlavor], default="sglang_router")
    parser.add_argument("--new-tokens", type=int, default=12)
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").exists():
        print(f"[demo] generating the small V4.1 checkpoint in {args.checkpoint}", flush=True)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_checkpoint.py"), "--config", "small",
                        "--seed", "0", "--out", str(args.checkpoint), "--quiet"], check=True)
    logs = Path(tempfile.mkdtemp(prefix="sglang-asym-demo-"))
    started = []
    router = None
    try:
        p = start_server("asym-prefill", args.checkpoint, logs)
        d = start_server("asym-decode", args.checkpoint, logs)
        started += [p, d]
        for server in started:
            wait_healthy(server, timeout_s=300)
        router = RouterProcess(RouterConfig(prefill=(PrefillWorker(p.url, p.bootstrap_port),), decode=(d.url,),
                                            port=pick_free_port(), flavor=RouterFlavor(args.router)),
                               log_path=logs / "router.log")
        router.start(ready_timeout_s=120)
        print(f"[demo] router {router.url} -> P {p.url} (bootstrap {p.bootstrap_port}), D {d.url}; logs in {logs}")
        print(f"[demo] memory after loading: P {p.rss_mb():.0f} MB, D {d.rss_mb():.0f} MB "
              f"(P holds the encoder + layer 20's KV path only)\n")
        long_text = " ".join(f"Paragraph {i}: the prefill worker computes the prefix and ships it." for i in range(40))
        prompts = [
            ("shorter than W", {"text": "The asymmetric split of DeepSeek-V4.1"}),
            ("exactly W tokens", {"input_ids": [(i * 37 + 11) % 700 + 3 for i in range(W)]}),
            ("long prompt", {"text": long_text}),
        ]
        for label, prompt in prompts:
            body = {**prompt, "sampling_params": {"max_new_tokens": args.new_tokens, "temperature": 0}}
            last, ttft, gaps = stream_generate(router.url, body)
            meta = last["meta_info"]
            n = meta["prompt_tokens"]
            b = max(n - W, 0)
            itl = sum(gaps) / len(gaps) if gaps else float("nan")
            print(f"== {label}: N={n} prompt tokens; P computed [0, {b}), D computed [{b}, {n}) then decoded")
            print(f"   output: {last['text']!r}")
            print(f"   TTFT {1000 * ttft:.0f} ms, mean ITL {1000 * itl:.0f} ms over {len(gaps)} gaps, "
                  f"finish {meta['finish_reason']}")
        for name, server in (("P", p), ("D", d)):
            metrics = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
            moved = [line for line in metrics.splitlines()
                     if line.startswith(("sglang_asym:kv_transfer_bytes_sum", "sglang_asym:kv_transfer_bytes_count",
                                         "sglang_asym:window_step_tokens_total"))]
            print(f"[demo] {name} metrics: " + "; ".join(m.split("{")[0] + " " + m.split()[-1] for m in moved))
        print(f"[demo] memory at the end: P {p.rss_mb():.0f} MB, D {d.rss_mb():.0f} MB")
        return 0
    finally:
        if router is not None:
            router.stop()
        for server in started:
            server.stop()
        print("[demo] stopped router, P and D")


if __name__ == "__main__":
    sys.exit(main())
