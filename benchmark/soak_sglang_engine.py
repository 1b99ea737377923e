"""Load and soak of the asym pair served by SGLang's own engine on CPU, behind sglang-router.

The load of soak_load.py (a warm-up, the soak with about --disrupt of its requests disconnected or aborted
at random, then a burst of --concurrent streams at once; each request must complete, or end clearly: an
HTTP error status, an SSE error event or finish_reason abort, never a hang), against
`python -m sglang.launch_server --device cpu --disaggregation-mode asym-prefill | asym-decode` on the
small checkpoint at SGLang's pool geometry, with SGLang's own transfer deadlines (its defaults) and the
CPU defaults (8 running requests, an 8k-token pool per worker). What a worker holds:
  pools     SGLang's own sglang:num_used_tokens on P and D, back at 0 after each phase;
  holdings  threads, open fds and sockets of each worker's whole process tree (HTTP launcher, scheduler,
            detokenizer), the router's keep-alive connections counted apart; measured after the warm-up,
            after the soak and after the burst.
  Mooncake  the memory regions each scheduler holds registered with the Mooncake Transfer Engine
            (sglang_asym:mooncake_regions_registered_total minus ..._deregistered_total on /metrics).
Results go into benchmark/results/reliability.json (or --out) under "soak_sglang_engine", with the command.

    .venv/bin/python benchmark/soak_sglang_engine.py [--concurrent 200 --requests 2000]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from process_memory import process_tree  # benchmark/ is the script's own folder on sys.path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))  # the harness (harness.*) and the system tests' helpers, before their imports
from harness.router_launch import RouterProcess  # noqa: E402
from harness.server_process import ServerProcess, start_server  # noqa: E402
from soak_load import (LoadConfig, add_load_args, burst, growth, merge_into, process_resources,  # noqa: E402
                       router_in_front, soak, summary)
from system.sglang_servers import metric_sum, mooncake_regions, write_sglang_checkpoint  # noqa: E402  (/metrics readers)
USED_TOKENS = "sglang:num_used_tokens"


def settle(servers: dict[str, ServerProcess], timeout_s: float) -> dict[str, float]:
    """Seconds until every worker's used tokens are 0 (AssertionError naming what is left otherwise)."""
    started, deadline = time.monotonic(), time.monotonic() + timeout_s
    back: dict[str, float] = {}
    while len(back) < len(servers):
        for name, server in servers.items():
            if name not in back and metric_sum(server, USED_TOKENS) == 0:
                back[name] = round(time.monotonic() - started, 3)
        if len(back) < len(servers):
            if time.monotonic() > deadline:
                left = {n: metric_sum(s, USED_TOKENS) for n, s in servers.items() if n not in back}
                raise AssertionError(f"used tokens not back at 0 after {timeout_s} s: {left}")
            time.sleep(0.5)
    return back


def tree_resources(pid: int, router_pid: int | None) -> dict[str, int]:
    total: dict[str, int] = {"processes": 0}
    for p in process_tree(pid):
        try:
            res = process_resources(p, router_pid)
        except OSError:
            continue
        total["processes"] += 1
        for k, v in res.items():
            total[k] = total.get(k, 0) + v
    return total


def holdings(servers: dict[str, ServerProcess], router_pid: int | None) -> dict[str, dict[str, int]]:
    return {name: {**tree_resources(s.proc.pid, router_pid), "mooncake_registrations": mooncake_regions(s)}
            for name, s in servers.items()}


def warm_gauges(router_url: str) -> None:
    """SGLang publishes a fresh D's used-token gauge with its first decode stats (every 40 decode steps)."""
    import json
    import urllib.request

    body = {"input_ids": list(range(3, 153)), "sampling_params": {"max_new_tokens": 48, "temperature": 0,
                                                                   "ignore_eos": True}}
    req = urllib.request.Request(router_url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_and_soak(router_url: str, servers: dict[str, ServerProcess], cfg: LoadConfig, router_pid: int,
                  pools_back_s: float) -> dict:
    workers = (servers["decode"].url, servers["prefill"].url)  # D first: its abort then never races P's
    progress("warm-up")
    warm_gauges(router_url)
    at_start = holdings(servers, router_pid)
    warm = soak(router_url, workers, dataclasses.replace(cfg, requests=3 * cfg.soak_concurrency, seed=cfg.seed + 99))
    settle(servers, pools_back_s)
    before = holdings(servers, router_pid)
    progress(f"soak: {cfg.requests} requests, {cfg.soak_concurrency} at a time")
    t0 = time.monotonic()
    soak_out = soak(router_url, workers, cfg)
    soak_s = time.monotonic() - t0
    soak_back = settle(servers, pools_back_s)
    after = holdings(servers, router_pid)
    progress(f"soak done in {soak_s:.0f} s: {summary(soak_out)['by_plan']}; burst of {cfg.concurrent}")
    t0 = time.monotonic()
    burst_out = burst(router_url, cfg)
    burst_s = time.monotonic() - t0
    burst_back = settle(servers, pools_back_s)
    progress(f"burst done in {burst_s:.0f} s: {summary(burst_out)['by_plan']}")
    return {"config": {**asdict(cfg), "prompt_tokens": list(cfg.prompt_tokens)},
            "warm_up": summary(warm),
            "soak": {**summary(soak_out), "seconds": round(soak_s, 3), "used_tokens_back_s": soak_back},
            "burst": {**summary(burst_out), "seconds": round(burst_s, 3), "used_tokens_back_s": burst_back},
            "holdings": {"at_start": at_start, "before_soak": before, "after_soak": after,
                         "after_burst": holdings(servers, router_pid)},
            "growth_over_soak": growth(before, after)}


def start_stack(checkpoint: Path, logs: Path, threads: int) -> tuple[dict[str, ServerProcess], RouterProcess]:
    common = ("--device", "cpu", "--enable-metrics", "--asym-semantics", "asym-exact-encoder")
    # torch's default of one OpenMP thread per core in each server makes every forward wait for a core
    # the other server holds (docs/sglang-engine-cpu.md): each gets its share of the cores
    env = {"SGLANG_PLUGINS": "sglang_asym", "OMP_NUM_THREADS": str(threads)}
    servers = {role: start_server(f"asym-{role}", checkpoint, logs, *common, module="sglang.launch_server", env=env)
               for role in ("prefill", "decode")}
    # SGLang's /health runs a request through the scheduler: on 2 busy cores it can take seconds
    checks = ("--disable-circuit-breaker", "--health-check-timeout-secs", "60", "--health-failure-threshold", "10")
    return servers, router_in_front(servers, logs, checks, healthy_s=600)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_load_args(ap)
    ap.add_argument("--request-timeout", type=float, default=300.0,
                    help="a request not ended by then counts as a hang")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmark" / "results" / "reliability.json",
                    help="the JSON file the result is merged into (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="OpenMP threads per server (default: half the cores each)")
    ap.add_argument("--logs", type=Path, default=None, help="keep the servers' and router's logs here")
    args = ap.parse_args(argv)
    cfg = LoadConfig(concurrent=args.concurrent, requests=args.requests, soak_concurrency=args.soak_concurrency,
                     disrupt=args.disrupt, request_timeout_s=args.request_timeout)
    command = "python benchmark/soak_sglang_engine.py " + " ".join(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="soak-sglang-") as tmp:
        progress("writing the checkpoint")
        checkpoint = write_sglang_checkpoint(Path(tmp) / "ckpt")
        logs = args.logs or Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        progress(f"starting P, D and sglang-router (logs in {logs})")
        servers, router = start_stack(checkpoint, logs, args.threads)
        try:
            result = load_and_soak(router.url, servers, cfg, router.pid, pools_back_s=120.0)
        finally:
            router.stop()
            for s in servers.values():
                s.stop()
    result["command"] = command
    result["threads_per_server"] = args.threads
    print(json_summary(result))
    merge_into(args.out, "soak_sglang_engine", result)
    return 0


def json_summary(result: dict) -> str:
    import json

    keys = ("warm_up", "soak", "burst", "growth_over_soak")
    return json.dumps({k: result[k] for k in keys}, indent=1)


if __name__ == "__main__":
    sys.exit(main())
