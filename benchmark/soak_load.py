"""Streaming load through sglang-router for the soak benchmark: clients that disconnect or abort, a soak, a burst.

What soak_sglang_engine.py drives the asym pair with: the load's settings and their flags, a streaming
/generate client that can leave before its first token, leave mid-stream or abort its request on the
workers, the soak (many requests a few at a time, some disrupted) and the burst (many at once), a summary
of how they ended, the threads / fds / sockets of a process, the router started in front of the pair, and
the merge of a result into a JSON file. The harness (harness.*) is imported from test/: the caller puts
test/ on sys.path first.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness.router_launch import PrefillWorker, RouterConfig, RouterProcess, pick_free_port
from harness.server_process import ServerProcess, wait_healthy
from harness.sse_lines import data_payloads

TOKEN_IDS = (3, 500)  # prompt token ids: above the special ids, inside the small checkpoint's vocabulary
PROGRESS_EVERY = 100  # soak requests between progress lines

# How a request is disrupted; an undisrupted one (NONE) must complete whole.
NONE, GONE_BEFORE_FIRST, GONE_MID_STREAM, ABORT = "none", "gone_before_first_token", "gone_mid_stream", "abort"
DISRUPTIONS = (GONE_BEFORE_FIRST, GONE_MID_STREAM, ABORT)


@dataclass(frozen=True)
class LoadConfig:
    concurrent: int = 200  # streams at once in the burst
    requests: int = 2000  # soak requests
    soak_concurrency: int = 6  # soak requests in flight at once
    disrupt: float = 0.1  # share of soak requests disrupted, at random
    prompt_tokens: tuple[int, int] = (140, 300)  # longer than the window (128): every request transfers
    max_new_tokens: int = 8
    request_timeout_s: float = 120.0  # a request not ended by then is a hang
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.concurrent, self.requests, self.soak_concurrency) < 1:
            raise ValueError("concurrent, requests and soak_concurrency must be >= 1")
        if not 0.0 <= self.disrupt <= 1.0:
            raise ValueError(f"disrupt must be in [0, 1], got {self.disrupt}")
        if not 0 < self.prompt_tokens[0] <= self.prompt_tokens[1] or self.max_new_tokens < 2:
            raise ValueError(f"bad prompt_tokens {self.prompt_tokens} or max_new_tokens {self.max_new_tokens}")


def add_load_args(ap: argparse.ArgumentParser) -> None:
    """LoadConfig's flags."""
    ap.add_argument("--concurrent", type=int, default=LoadConfig.concurrent, help="streams at once in the burst")
    ap.add_argument("--requests", type=int, default=LoadConfig.requests, help="soak requests")
    ap.add_argument("--soak-concurrency", type=int, default=LoadConfig.soak_concurrency,
                    help="soak requests in flight at once")
    ap.add_argument("--disrupt", type=float, default=LoadConfig.disrupt,
                    help="share of soak requests disconnected or aborted at random")


@dataclass(frozen=True)
class Outcome:
    plan: str  # NONE or one of DISRUPTIONS
    kind: str  # completed | aborted (finish_reason abort) | error (HTTP status, SSE error) | gone | hang
    seconds: float
    detail: str = ""


def request_body(rng: random.Random, cfg: LoadConfig, tag: str) -> dict:
    ids = [rng.randrange(*TOKEN_IDS) for _ in range(rng.randint(*cfg.prompt_tokens))]
    return {"input_ids": ids, "rid": f"{tag}-{rng.getrandbits(48):012x}",
            "sampling_params": {"max_new_tokens": cfg.max_new_tokens, "temperature": 0, "ignore_eos": True}}


def abort_on(workers: tuple[str, ...], rid: str) -> None:
    """POST /abort_request for `rid` to each worker (sglang-router serves no /abort_request)."""
    for url in workers:
        req = urllib.request.Request(url + "/abort_request", data=json.dumps({"rid": rid}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10):
                pass
        except urllib.error.HTTPError:
            pass  # the rid is already gone there


def stream_one(router_url: str, body: dict, plan: str, cfg: LoadConfig, rng: random.Random,
               workers: tuple[str, ...] = ()) -> Outcome:
    """One streaming /generate through the router, disrupted as `plan` says, and how it ended."""
    started = time.monotonic()

    def end(kind: str, detail: str = "") -> Outcome:
        return Outcome(plan, kind, time.monotonic() - started, detail)

    host, port = router_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=cfg.request_timeout_s)
    try:
        conn.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        if plan == GONE_BEFORE_FIRST:  # the router answers once P has: leave before that
            time.sleep(rng.uniform(0.0, 0.4))
            return end("gone")
        resp = conn.getresponse()
        if resp.status != 200:
            return end("error", f"HTTP {resp.status}: {resp.read()[:200]!r}")
        for n, payload in enumerate(data_payloads(resp), 1):
            if payload == "[DONE]":
                return end("error", "[DONE] before a finish_reason")
            event = json.loads(payload)
            if "error" in event:
                return end("error", json.dumps(event["error"])[:200])
            if plan == GONE_MID_STREAM:
                return end("gone")
            if plan == ABORT and n == 1:
                abort_on(workers, body["rid"])
            meta = event["meta_info"]
            if meta["finish_reason"] is not None:
                reason = meta["finish_reason"]
                kind = {"length": "completed", "abort": "aborted"}.get(reason["type"], "error")
                if kind == "completed" and meta["completion_tokens"] != body["sampling_params"]["max_new_tokens"]:
                    kind = "error"
                return end(kind, "" if kind == "completed" else json.dumps(reason))
        return end("error", "stream closed before a finish_reason")
    except TimeoutError:
        return end("hang", f"no end within {cfg.request_timeout_s} s")
    except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
        return end("error", f"{type(exc).__name__}: {exc}"[:200])
    finally:
        conn.close()


def burst(router_url: str, cfg: LoadConfig) -> list[Outcome]:
    """cfg.concurrent undisrupted streams started at once."""
    rng = random.Random(cfg.seed)
    bodies = [request_body(rng, cfg, "burst") for _ in range(cfg.concurrent)]
    with concurrent.futures.ThreadPoolExecutor(cfg.concurrent) as pool:
        return list(pool.map(lambda b: stream_one(router_url, b, NONE, cfg, random.Random(0)), bodies))


def soak(router_url: str, workers: tuple[str, ...], cfg: LoadConfig) -> list[Outcome]:
    """cfg.requests streams, cfg.soak_concurrency in flight, about cfg.disrupt of them disrupted; an ABORT
    request is aborted on `workers` (in that order) after its first event."""
    rng = random.Random(cfg.seed + 1)
    jobs = []
    for i in range(cfg.requests):  # the plan drawn first, then the body: soak.py's sequence for a seed
        plan = rng.choice(DISRUPTIONS) if rng.random() < cfg.disrupt else NONE
        jobs.append((request_body(rng, cfg, f"soak{i}"), plan, random.Random(rng.getrandbits(32))))
    ended: dict[str, int] = {}
    lock, started = threading.Lock(), time.monotonic()

    def run(job: tuple[dict, str, random.Random]) -> Outcome:
        outcome = stream_one(router_url, job[0], job[1], cfg, job[2], workers)
        with lock:
            ended[outcome.kind] = ended.get(outcome.kind, 0) + 1
            if sum(ended.values()) % PROGRESS_EVERY == 0:
                print(f"[{time.strftime('%H:%M:%S')}] soak: {sum(ended.values())} of {cfg.requests} ended after "
                      f"{time.monotonic() - started:.0f} s: {ended}", file=sys.stderr, flush=True)
        return outcome

    with concurrent.futures.ThreadPoolExecutor(cfg.soak_concurrency) as pool:
        return list(pool.map(run, jobs))


def summary(outcomes: list[Outcome]) -> dict:
    """Counts by plan and outcome, the slowest and median end, and up to five failure details."""
    by_plan: dict[str, dict[str, int]] = {}
    for o in outcomes:
        by_plan.setdefault(o.plan, {}).setdefault(o.kind, 0)
        by_plan[o.plan][o.kind] += 1
    seconds = [o.seconds for o in outcomes]
    return {"requests": len(outcomes), "by_plan": by_plan, "max_seconds": round(max(seconds), 3),
            "median_seconds": round(statistics.median(seconds), 3),
            "failure_details": sorted({o.detail for o in outcomes if o.kind in ("error", "hang")})[:5]}


def _sockets(pid: int) -> set[str]:
    """Inodes of the sockets a process has open."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _tcp_ends() -> dict[str, tuple[str, str]]:
    """inode -> (local, remote) address of every TCP socket on the host (/proc/net/tcp{,6}, hex)."""
    ends = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                ends[fields[9]] = (fields[1], fields[2])
    return ends


def process_resources(pid: int, router_pid: int | None = None) -> dict[str, int]:
    """Threads, open fds and sockets of one process (/proc/<pid>/). With router_pid, the TCP connections from
    the router (its keep-alive pool, which follows its busiest moment) are counted apart as router_connections
    and left out of fds and sockets. OSError when the process is gone."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    sockets = _sockets(pid)
    from_router = 0
    if router_pid is not None:
        ends = _tcp_ends()
        router_locals = {ends[i][0] for i in _sockets(router_pid) if i in ends}
        from_router = sum(1 for i in sockets if i in ends and ends[i][1] in router_locals)
    return {"threads": len(os.listdir(f"/proc/{pid}/task")), "fds": fds - from_router,
            "sockets": len(sockets) - from_router, "router_connections": from_router}


def growth(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """worker -> resource -> increase from `before` to `after`, for what grew (router_connections aside)."""
    grown = {name: {k: after[name][k] - v for k, v in res.items() if k != "router_connections" and after[name][k] > v}
             for name, res in before.items()}
    return {name: g for name, g in grown.items() if g}


def router_in_front(servers: dict[str, ServerProcess], logs: Path, extra_args: tuple[str, ...] = (),
                    healthy_s: float = 180) -> RouterProcess:
    """sglang-router (no retries) in front of servers["prefill"] and servers["decode"] once both are healthy;
    on any failure the router and both servers are stopped before the error propagates."""
    prefill = servers["prefill"]
    router = RouterProcess(RouterConfig(prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),),
                                        decode=(servers["decode"].url,), port=pick_free_port(), retry_max_retries=1,
                                        extra_args=extra_args),
                           log_path=logs / "router.log")
    try:
        for s in servers.values():
            wait_healthy(s, healthy_s)
        router.start(ready_timeout_s=180)
    except BaseException:
        router.stop()
        for s in servers.values():
            s.stop()
        raise
    return router


def merge_into(path: Path, key: str, value: dict) -> None:
    """Set `key` of the JSON object in `path` (created if missing) to `value`."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
