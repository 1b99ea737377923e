"""Load and soak of the asym P/D pair behind sglang-router, and the TTFT cost of D's recompute fallback.

Starts asym-prefill (P), asym-decode (D, --transfer-fallback recompute) and sglang-router on 127.0.0.1
over the tiny preset checkpoint, then:
  1. soak: after a short warm-up, --requests streaming requests, --soak-concurrency at a time, about
     --disrupt of them disrupted at random (client gone before the first token, client gone mid-stream,
     or /abort_request sent to D and P under the request's rid); every undisrupted one must complete;
  2. P's and D's pools (/server_info) back at their values before anything ran, and their threads,
     sockets, file descriptors (/proc/<pid>/) and Mooncake registrations not above their values after
     the warm-up (which fills the thread pools and keep-alive connections the soak reuses);
  3. burst: --concurrent streaming requests at once; each must complete or fail clearly (HTTP error
     status, SSE error event or finish_reason abort) within the request timeout, never hang; pools back;
  4. TTFT of the same prompts through a normal transfer vs D's recompute fallback (D pointed at a
     bootstrap port where nothing listens), interleaved in one run.
Results go into benchmark/results/reliability.json (keys "soak" and "transfer_fallback") with the
command. test/system/test_load_and_fallback.py runs a short variant of the same functions in CI.

    python benchmark/soak.py [--concurrent 200 --requests 2000 --out benchmark/results/reliability.json]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterProcess, pick_free_port
from sglang_asym.testing.pool_watch import read_pools, wait_pools_back
from sglang_asym.testing.server_process import ServerProcess, start_server, wait_healthy
from sglang_asym.testing.sse_lines import data_payloads

ROOT = Path(__file__).resolve().parents[1]
TRANSFER_TIMEOUT_S = 5
VOCAB = 500  # token ids below the tiny preset's vocabulary (512), above its special ids
PROGRESS_EVERY = 100  # soak requests between progress lines


@dataclass(frozen=True)
class LoadConfig:
    concurrent: int = 200  # streaming requests at once in the burst
    requests: int = 2000  # soak requests
    soak_concurrency: int = 6  # soak requests in flight at once (below P's 8 transfer rows sets)
    disrupt: float = 0.1  # fraction of soak requests disconnected or aborted at random
    prompt_tokens: tuple[int, int] = (140, 300)  # above the tiny preset's window (128): every one transfers
    max_new_tokens: int = 8
    request_timeout_s: float = 120.0  # a request not ended by then counts as a hang
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concurrent < 1 or self.requests < 1 or self.soak_concurrency < 1:
            raise ValueError("concurrent, requests and soak_concurrency must be >= 1")
        if not 0.0 <= self.disrupt <= 1.0:
            raise ValueError(f"disrupt must be in [0, 1], got {self.disrupt}")
        if not 0 < self.prompt_tokens[0] <= self.prompt_tokens[1] or self.max_new_tokens < 2:
            raise ValueError(f"bad prompt_tokens {self.prompt_tokens} or max_new_tokens {self.max_new_tokens}")


# How a soak request is disrupted; NONE requests must complete whole.
NONE, GONE_BEFORE_FIRST, GONE_MID_STREAM, ABORT = "none", "gone_before_first_token", "gone_mid_stream", "abort"
DISRUPTIONS = (GONE_BEFORE_FIRST, GONE_MID_STREAM, ABORT)


@dataclass(frozen=True)
class Outcome:
    plan: str
    kind: str  # completed | aborted (finish_reason abort) | error (HTTP status / SSE error) | gone | hang
    seconds: float
    detail: str = ""


def prompt(rng: random.Random, cfg: LoadConfig) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(rng.randint(*cfg.prompt_tokens))]


def _post(url: str, body: dict, timeout_s: float = 10.0) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def stream_one(router_url: str, body: dict, plan: str, cfg: LoadConfig, rng: random.Random,
               workers: tuple[str, ...] = ()) -> Outcome:
    """One streaming /generate through the router, disrupted as `plan` says; how it ended."""
    started = time.monotonic()
    host, port = router_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=cfg.request_timeout_s)
    try:
        conn.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        if plan == GONE_BEFORE_FIRST:  # the router sends its headers once P answered: leave before that
            time.sleep(rng.uniform(0.0, 0.4))
            return Outcome(plan, "gone", time.monotonic() - started)
        resp = conn.getresponse()
        if resp.status != 200:
            return Outcome(plan, "error", time.monotonic() - started, f"HTTP {resp.status}: {resp.read()[:200]!r}")
        events = 0
        for payload in data_payloads(resp):
            if payload == "[DONE]":
                return Outcome(plan, "error", time.monotonic() - started, "[DONE] without a final event")
            event = json.loads(payload)
            if "error" in event:
                return Outcome(plan, "error", time.monotonic() - started, json.dumps(event["error"])[:200])
            events += 1
            if plan == GONE_MID_STREAM:
                return Outcome(plan, "gone", time.monotonic() - started)
            if plan == ABORT and events == 1:
                for url in workers:  # sglang-router serves no /abort_request: each worker, the client's rid
                    _post(url + "/abort_request", {"rid": body["rid"]})
            reason = event["meta_info"]["finish_reason"]
            if reason is not None:
                kind = {"length": "completed", "abort": "aborted"}.get(reason["type"], "error")
                if kind == "completed" and event["meta_info"]["completion_tokens"] != body["sampling_params"]["max_new_tokens"]:
                    kind = "error"
                return Outcome(plan, kind, time.monotonic() - started, "" if kind == "completed" else json.dumps(reason))
        return Outcome(plan, "error", time.monotonic() - started, "stream closed without a final event")
    except TimeoutError:
        return Outcome(plan, "hang", time.monotonic() - started, f"no end within {cfg.request_timeout_s} s")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return Outcome(plan, "error", time.monotonic() - started, f"{type(exc).__name__}: {exc}"[:200])
    finally:
        conn.close()


def request_body(rng: random.Random, cfg: LoadConfig, tag: str) -> dict:
    return {"input_ids": prompt(rng, cfg), "rid": f"{tag}-{rng.getrandbits(48):012x}",
            "sampling_params": {"max_new_tokens": cfg.max_new_tokens, "temperature": 0, "ignore_eos": True}}


def burst(router_url: str, cfg: LoadConfig, n: int | None = None) -> list[Outcome]:
    """n (cfg.concurrent) undisrupted streams started at once."""
    n = n or cfg.concurrent
    rng = random.Random(cfg.seed)
    bodies = [request_body(rng, cfg, "burst") for _ in range(n)]
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda b: stream_one(router_url, b, NONE, cfg, random.Random(0)), bodies))


def soak(router_url: str, workers: tuple[str, ...], cfg: LoadConfig) -> list[Outcome]:
    """cfg.requests streams, cfg.soak_concurrency in flight, about cfg.disrupt of them disrupted."""
    rng = random.Random(cfg.seed + 1)
    jobs = []
    for i in range(cfg.requests):
        plan = rng.choice(DISRUPTIONS) if rng.random() < cfg.disrupt else NONE
        jobs.append((request_body(rng, cfg, f"soak{i}"), plan, random.Random(rng.getrandbits(32))))
    done, lock, started = collections.Counter(), threading.Lock(), time.monotonic()

    def run(job) -> Outcome:
        outcome = stream_one(router_url, job[0], job[1], cfg, job[2], workers)
        with lock:
            done[outcome.kind] += 1
            finished = sum(done.values())
            if finished % PROGRESS_EVERY == 0:  # a long soak says how far it is
                print(f"[{time.strftime('%H:%M:%S')}] soak: {finished} of {cfg.requests} ended after "
                      f"{time.monotonic() - started:.0f} s: {dict(done)}", file=sys.stderr, flush=True)
        return outcome

    with concurrent.futures.ThreadPoolExecutor(cfg.soak_concurrency) as pool:
        return list(pool.map(run, jobs))


def summary(outcomes: list[Outcome]) -> dict:
    """Counts by plan and outcome kind, the slowest end, and a few failure details."""
    counts: dict[str, dict[str, int]] = {}
    for o in outcomes:
        counts.setdefault(o.plan, {}).setdefault(o.kind, 0)
        counts[o.plan][o.kind] += 1
    details = sorted({o.detail for o in outcomes if o.kind in ("error", "hang")})[:5]
    return {"requests": len(outcomes), "by_plan": counts, "max_seconds": round(max(o.seconds for o in outcomes), 3),
            "median_seconds": round(statistics.median(o.seconds for o in outcomes), 3), "failure_details": details}


# ---- what a worker holds ---------------------------------------------------------------------------

pools = read_pools
wait_pools = wait_pools_back


def mooncake_registrations(snapshot: dict) -> int:
    return snapshot["transfer"]["mooncake_registered_regions"]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _tcp_table() -> dict[str, tuple[str, str]]:
    """inode -> (local address, remote address) of every TCP socket (/proc/net/tcp and tcp6, hex form)."""
    table = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                table[fields[9]] = (fields[1], fields[2])
    return table


def process_resources(pid: int, router_pid: int | None = None) -> dict[str, int]:
    """Threads, open fds and sockets of a process (/proc/<pid>/). With router_pid, the TCP connections
    that come from the router (its keep-alive pool: as many as its busiest moment, closed only after they
    idle out) are counted apart as router_connections and left out of fds and sockets."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    sockets = _socket_inodes(pid)
    from_router = 0
    if router_pid is not None:
        table = _tcp_table()
        router_ends = {table[i][0] for i in _socket_inodes(router_pid) if i in table}
        from_router = sum(1 for i in sockets if i in table and table[i][1] in router_ends)
    return {"threads": len(os.listdir(f"/proc/{pid}/task")), "fds": fds - from_router,
            "sockets": len(sockets) - from_router, "router_connections": from_router}


def holdings(servers: dict[str, ServerProcess], router_pid: int | None = None) -> dict[str, dict[str, int]]:
    """Per worker: threads, fds, sockets (without the router's connections) and Mooncake registrations."""
    return {name: {**process_resources(s.proc.pid, router_pid), "mooncake_registrations": mooncake_registrations(pools(s.url))}
            for name, s in servers.items()}


def growth(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """What grew from `before` to `after` (worker -> resource -> increase); empty when nothing did. The
    router's connections are not a worker's holding and are left out."""
    grown = {name: {k: after[name][k] - v for k, v in res.items() if k != "router_connections" and after[name][k] > v}
             for name, res in before.items()}
    return {name: g for name, g in grown.items() if g}


def settle(servers: dict[str, ServerProcess], start_pools: dict[str, dict], timeout_s: float) -> dict[str, float]:
    """Seconds until each worker's pools are back at start (AssertionError otherwise)."""
    return {name: round(wait_pools(s.url, start_pools[name], timeout_s), 3) for name, s in servers.items()}


def load_and_soak(router_url: str, servers: dict[str, ServerProcess], cfg: LoadConfig,
                  pools_back_s: float = 60.0, router_pid: int | None = None) -> dict:
    """A warm-up, the soak, then the burst; pools and holdings around each. The soak runs first: a burst
    past P's transfer rows gets 503s that can open the router's circuit for P. The caller asserts."""
    workers = (servers["decode"].url, servers["prefill"].url)  # D first: its abort then never races P's
    start_pools = {name: pools(s.url) for name, s in servers.items()}
    at_start = holdings(servers, router_pid)
    warm = soak(router_url, workers, dataclasses.replace(cfg, requests=3 * cfg.soak_concurrency, seed=cfg.seed + 99))
    settle(servers, start_pools, pools_back_s)
    before = holdings(servers, router_pid)
    t0 = time.monotonic()
    soak_out = soak(router_url, workers, cfg)
    soak_s = time.monotonic() - t0
    after_soak_back = settle(servers, start_pools, pools_back_s)
    after = holdings(servers, router_pid)
    t0 = time.monotonic()
    burst_out = burst(router_url, cfg)
    burst_s = time.monotonic() - t0
    after_burst_back = settle(servers, start_pools, pools_back_s)
    return {"config": {**asdict(cfg), "prompt_tokens": list(cfg.prompt_tokens)},
            "warm_up": summary(warm),
            "soak": {**summary(soak_out), "seconds": round(soak_s, 3), "pools_back_s": after_soak_back},
            "burst": {**summary(burst_out), "seconds": round(burst_s, 3), "pools_back_s": after_burst_back},
            "holdings": {"at_start": at_start, "before_soak": before, "after_soak": after,
                         "after_burst": holdings(servers, router_pid)},
            "growth_over_soak": growth(before, after), "burst_outcomes": burst_out, "soak_outcomes": soak_out}


# ---- recompute fallback: TTFT ----------------------------------------------------------------------

def first_token_s(url: str, body: dict, timeout_s: float = 120.0) -> tuple[float, dict]:
    """Seconds to the first SSE event of a streaming /generate, and the last event's meta_info."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    started = time.monotonic()
    try:
        conn.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        first, last = None, None
        for payload in data_payloads(resp):
            if payload != "[DONE]":
                first = first or time.monotonic() - started
                last = json.loads(payload)
        if last is None or "error" in last:
            raise RuntimeError(f"stream ended without tokens: {last}")
        return first, last["meta_info"]
    finally:
        conn.close()


def fallback_ttft(prefill: ServerProcess, decode: ServerProcess, prompt_lens: tuple[int, ...], rounds: int,
                  dead_port: int) -> dict:
    """TTFT of the same prompt (a) transferred: P and D get it under one room, as the router sends it, and
    (b) recomputed: D's bootstrap points at `dead_port`, the transfer fails at once and D computes the
    prefix itself. Interleaved, `rounds` of each per prompt length; medians and their ratio."""
    rng = random.Random(7)
    out = {}
    for n in prompt_lens:
        times: dict[str, list[float]] = {"transfer": [], "recompute": []}
        for r in range(rounds):
            ids = [rng.randrange(3, VOCAB) for _ in range(n)]
            sampling = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
            room = rng.getrandbits(62)
            body = {"input_ids": ids, "sampling_params": sampling, "bootstrap_host": "127.0.0.1",
                    "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": room, "rid": f"ttft-{n}-{r}"}
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                p_answer = pool.submit(_post, prefill.url + "/generate", {**body, "rid": body["rid"] + "-p"}, 120)
                t, meta = first_token_s(decode.url, body)
                if p_answer.result() != 200 or "transfer_fallback" in meta:
                    raise RuntimeError(f"the transferred request did not transfer: {meta}")
            times["transfer"].append(t)
            fb = {**body, "bootstrap_port": dead_port, "bootstrap_room": room + 1, "rid": body["rid"] + "-fb"}
            t, meta = first_token_s(decode.url, fb)
            if meta.get("transfer_fallback") != "recompute":
                raise RuntimeError(f"the fallback request did not fall back: {meta}")
            times["recompute"].append(t)
        med = {k: statistics.median(v) for k, v in times.items()}
        out[str(n)] = {"ttft_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
                       "median_ttft_s": {k: round(v, 4) for k, v in med.items()},
                       "recompute_over_transfer": round(med["recompute"] / med["transfer"], 3)}
    return out


# ---- the stack ---------------------------------------------------------------------------------------

def start_stack(checkpoint: Path, logs: Path, decode_extra: tuple[str, ...] = (),
                fallback: str = "recompute") -> tuple[dict, RouterProcess]:
    timeout = ("--transfer-timeout", str(TRANSFER_TIMEOUT_S))
    servers = {"prefill": start_server("asym-prefill", checkpoint, logs, *timeout),
               "decode": start_server("asym-decode", checkpoint, logs, *timeout, "--transfer-fallback", fallback,
                                      *decode_extra)}
    return servers, router_in_front(servers, logs)


def router_in_front(servers: dict[str, ServerProcess], logs: Path, extra_args: tuple[str, ...] = (),
                    healthy_s: float = 180) -> RouterProcess:
    """sglang-router in front of the started pair, once both are healthy (everything stopped on failure)."""
    router = RouterProcess(RouterConfig(prefill=(PrefillWorker(servers["prefill"].url, servers["prefill"].bootstrap_port),),
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


def add_load_args(ap: argparse.ArgumentParser) -> None:
    """The load phases' flags (LoadConfig), shared by both soak benchmarks."""
    ap.add_argument("--concurrent", type=int, default=200)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--soak-concurrency", type=int, default=6)
    ap.add_argument("--disrupt", type=float, default=0.1)


def merge_into(path: Path, key: str, value: dict) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_load_args(ap)
    ap.add_argument("--ttft-prompts", type=int, nargs="*", default=[512, 2048])
    ap.add_argument("--ttft-rounds", type=int, default=5)
    ap.add_argument("--transfer-fallback", choices=["off", "recompute"], default="recompute",
                    help="D's fallback during the load phases (the TTFT phase needs recompute)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmark" / "results" / "reliability.json")
    args = ap.parse_args(argv)
    cfg = LoadConfig(concurrent=args.concurrent, requests=args.requests, soak_concurrency=args.soak_concurrency,
                     disrupt=args.disrupt)
    command = "python benchmark/soak.py " + " ".join(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        checkpoint = Path(tmp) / "v41-tiny"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_checkpoint.py"), "--config", "tiny", "--seed",
                        "0", "--out", str(checkpoint), "--quiet"], check=True, timeout=300, capture_output=True)
        logs = Path(tmp) / "logs"
        logs.mkdir()
        servers, router = start_stack(checkpoint, logs, fallback=args.transfer_fallback)
        try:
            result = load_and_soak(router.url, servers, cfg, router_pid=router.pid)
            ttft = fallback_ttft(servers["prefill"], servers["decode"], tuple(args.ttft_prompts), args.ttft_rounds,
                                 pick_free_port()) if args.transfer_fallback == "recompute" else {}
        finally:
            router.stop()
            for s in servers.values():
                s.stop()
    for key in ("burst_outcomes", "soak_outcomes"):
        result.pop(key)
    load = os.getloadavg()
    result.update(command=command, load_average=[round(x, 2) for x in load])
    merge_into(args.out, "soak", result)
    merge_into(args.out, "transfer_fallback", {"command": command, "ttft": ttft,
                                               "load_average": [round(x, 2) for x in load]})
    print(json.dumps({"soak": result, "transfer_fallback_ttft": ttft}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
