"""The mission's command line on 127.0.0.1: `python -m sglang.launch_server --device cpu
--disaggregation-mode asym-prefill` and `asym-decode` (SGLang 0.5.23's own server with this plugin)
behind the real sglang-router, answering prompts shorter than W, exactly W and longer; each output must
equal the greedy tokens of the in-process reference model computing the pair's pieces (P's prefix
[0, B) in the prefill chunks, D's window [B, N) in its window chunks with the semantics' floors). Prints
the outputs, what P and D computed (P: layers 0-20's KV path over [0, N - W); D: all 40 layers over the last
W rows, then decode), TTFT, the bytes SGLang's sender moved and the P and D memory; stops everything.

The checkpoint is a small V4.1 with SGLang's pool geometry (head_dim 512) and random weights (the trained
tiny model's geometry does not fit SGLang's V4.1 pool), so the text is noise; the equality is the point.

    .venv/bin/python scripts/demo_sglang_engine.py [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess
from sglang_asym.testing.pair_reference import pair_greedy
from sglang_asym.testing.server_process import start_server, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
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


def router_over(prefill, decode) -> RouterProcess:
    router = RouterProcess(RouterConfig(
        prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),), decode=(decode.url,),
        flavor=RouterFlavor.SGLANG_ROUTER, retry_max_retries=1,
        extra_args=("--disable-circuit-breaker", "--health-check-timeout-secs", "60", "--health-failure-threshold",
                    "10")))
    router.start(ready_timeout_s=180)
    return router


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="demo_sglang_") as tmp:
        work = Path(tmp)
        checkpoint = args.checkpoint
        if checkpoint is None:
            sys.path.insert(0, str(ROOT / "test"))
            from system.sglang_servers import write_sglang_checkpoint

            print("[demo] writing a small V4.1 checkpoint at SGLang's pool geometry (random weights)", flush=True)
            checkpoint = write_sglang_checkpoint(work / "ckpt")
        logs = {role: work / f"{role}.jsonl" for role in ("prefill", "decode")}
        env = {"SGLANG_PLUGINS": "sglang_asym"}
        flags = ("--device", "cpu", "--enable-metrics", "--chunked-prefill-size", str(PREFILL_CHUNK))
        print("[demo] starting: python -m sglang.launch_server --device cpu --disaggregation-mode asym-prefill / "
              "asym-decode and sglang-router in front of them", flush=True)
        servers = {
            "P": start_server("asym-prefill", checkpoint, work, *flags,
                              module="sglang.launch_server", env={**env, "SGLANG_ASYM_FORWARD_LOG": str(logs["prefill"])}),
            "D": start_server("asym-decode", checkpoint, work, *flags,
                              module="sglang.launch_server", env={**env, "SGLANG_ASYM_FORWARD_LOG": str(logs["decode"])}),
        }
        from sglang_asym.model.loading import model_from_checkpoint

        reference = model_from_checkpoint(checkpoint, cache_quant="release")  # SGLang's v41 pool formats
        router = None
        failures = 0
        try:
            for server in servers.values():
                wait_healthy(server, timeout_s=900)
            print(f"[demo] memory after loading: P {rss_mb(servers['P'].proc.pid):.0f} MB, "
                  f"D {rss_mb(servers['D'].proc.pid):.0f} MB (P holds the encoder + layer 20's KV path only)")
            router = router_over(servers["P"], servers["D"])
            for label, n in LENGTHS:
                for path in logs.values():
                    path.unlink(missing_ok=True)
                body = {"input_ids": prompt(n), "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0,
                                                                    "ignore_eos": True}}  # the reference decodes NEW_TOKENS too
                mb = transfer_mb(servers["P"].url)
                last, ttft, gaps = stream_generate(router.url, body)
                moved = transfer_mb(servers["P"].url) - mb
                same = last["output_ids"] == pair_greedy(reference, prompt(n), PREFILL_CHUNK, SEMANTICS, NEW_TOKENS)
                failures += not same
                p_rows = [(s, e) for f in forwards(logs["prefill"]) for room, s, e in f["rows"] if room]
                d_window = [(s, e) for f in forwards(logs["decode"]) if f["mode"] == "extend"
                            for room, s, e in f["rows"] if room]
                b = max(n - W, 0)
                print(f"== {label}: N={n}, B=N-W={b}")
                print(f"   P computed {p_rows or 'nothing (N <= W: no forward)'} through layers 0-19 + layer 20's KV path")
                print(f"   D computed the window {d_window} through all 40 layers, then decoded")
                print(f"   output ids {last['output_ids']}")
                print(f"   equal to the in-process reference model: {same}; TTFT {1000 * ttft:.0f} ms, "
                      f"mean ITL {1000 * sum(gaps) / max(len(gaps), 1):.0f} ms; SGLang's sender moved {moved:.3f} MB")
        finally:
            if router is not None:
                router.stop()
            for server in servers.values():
                server.stop()
    print("[demo] SGLang's engine served the asymmetric pair " +
          ("with the reference model's tokens" if not failures else f"with {failures} mismatching outputs"))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
