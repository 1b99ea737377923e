"""Helpers of the fault tests: a tiny P + D + router trio (and a longer-lived stack whose workers restart on
their ports), a streaming client that reports how its stream ended, waiting until a worker's pools are back
at their start values, and recording measured times into benchmark/results/reliability.json."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from sglang_asym.testing.pool_watch import read_pools, wait_pools_back
from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess, pick_free_port
from sglang_asym.testing.server_process import ServerProcess, start_server, wait_healthy
from sglang_asym.testing.sse_lines import data_payloads

from .helpers import router_over, serving

D_TRANSFER_TIMEOUT_S = 5


def pools(server: ServerProcess) -> dict:
    return read_pools(server.url)


def wait_pools(server: ServerProcess, expected: dict, timeout_s: float) -> float:
    return wait_pools_back(server.url, expected, timeout_s, label=server.mode)


@dataclass
class StreamEnd:
    events: list = field(default_factory=list)
    status: int | None = None
    done: bool = False  # saw data: [DONE]
    error: str | None = None  # an SSE error event, an HTTP error body, or the connection's failure
    seconds: float = 0.0  # from the request to the end of the stream


def open_stream(url: str, body: dict, timeout_s: float) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    conn.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def read_stream(resp: http.client.HTTPResponse, started: float, first_events: list | None = None) -> StreamEnd:
    end = StreamEnd(list(first_events or []), resp.status)
    try:
        if resp.status != 200:
            end.error = resp.read().decode(errors="replace") or f"HTTP {resp.status}"
            return end
        for payload in data_payloads(resp):
            if payload == "[DONE]":
                end.done = True
                break
            event = json.loads(payload)
            if "error" in event:
                end.error = json.dumps(event["error"])
            end.events.append(event)
        else:
            end.error = end.error or "stream closed without [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        end.error = end.error or f"{type(exc).__name__}: {exc}"
    finally:
        end.seconds = time.monotonic() - started
    return end


def first_event(resp: http.client.HTTPResponse) -> list:
    """Read until the first SSE data event (the request is then decoding on D)."""
    for payload in data_payloads(resp):
        return [json.loads(payload)]
    raise AssertionError("stream ended before its first event")


@contextlib.contextmanager
def trio(checkpoint: Path, logs: Path, flavor: RouterFlavor = RouterFlavor.SGLANG_ROUTER) -> Iterator[dict]:
    """P, D (transfer timeout D_TRANSFER_TIMEOUT_S) and the router; everything stopped on exit."""
    servers = {"prefill": start_server("asym-prefill", checkpoint, logs, "--transfer-timeout", str(D_TRANSFER_TIMEOUT_S)),
               "decode": start_server("asym-decode", checkpoint, logs, "--transfer-timeout", str(D_TRANSFER_TIMEOUT_S))}
    with serving(servers, timeout_s=120):
        with router_over(servers["prefill"], servers["decode"], flavor) as router:
            yield {**servers, "router": router}


RELIABILITY_OUT_ENV = "SGLANG_ASYM_RELIABILITY_OUT"


def record(scenario: str, **facts) -> None:
    """Merge a scenario's measured facts into the JSON file named by $SGLANG_ASYM_RELIABILITY_OUT (if set)."""
    out = os.environ.get(RELIABILITY_OUT_ENV)
    print(f"{scenario}: {facts}")
    if not out:
        return
    path = Path(out)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("command", f"{RELIABILITY_OUT_ENV}={out} python -m pytest {' '.join(sys.argv[1:])}")
    data.setdefault("scenarios", {})[scenario] = facts
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


@dataclass
class Stack:
    """P, D and a router with its circuit breaker on (the router's default): a worker a scenario kills is
    restarted on its own port, so the router's configuration stays valid across scenarios."""

    checkpoint: Path
    logs: Path
    prefill: ServerProcess
    decode: ServerProcess
    router: RouterProcess
    decode_args: tuple[str, ...]
    prefill_args: tuple[str, ...]

    def restart_decode(self, timeout_s: float = 120.0) -> float:
        """Start D again on its port (the old process must be gone); seconds until it is healthy."""
        assert self.decode.proc.poll() is not None, "restart_decode needs D stopped first"
        started = time.monotonic()
        self.decode = start_server("asym-decode", self.checkpoint, self.logs, *self.decode_args, port=self.decode.port)
        wait_healthy(self.decode, timeout_s)
        return time.monotonic() - started

    def restart_prefill(self, timeout_s: float = 120.0) -> float:
        """Start P again on its HTTP and bootstrap ports (the old process must be gone); seconds until healthy."""
        assert self.prefill.proc.poll() is not None, "restart_prefill needs P stopped first"
        started = time.monotonic()
        self.prefill = start_server("asym-prefill", self.checkpoint, self.logs, *self.prefill_args,
                                    port=self.prefill.port, bootstrap_port=self.prefill.bootstrap_port)
        wait_healthy(self.prefill, timeout_s)
        return time.monotonic() - started

    def stop(self) -> None:
        self.router.stop()
        for server in (self.prefill, self.decode):
            server.stop()


@contextlib.contextmanager
def stack(checkpoint: Path, logs: Path, decode_extra: tuple[str, ...] = ()) -> Iterator[Stack]:
    timeout = ("--transfer-timeout", str(D_TRANSFER_TIMEOUT_S))
    prefill = start_server("asym-prefill", checkpoint, logs, *timeout)
    decode = start_server("asym-decode", checkpoint, logs, *timeout, *decode_extra)
    router = RouterProcess(RouterConfig(prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),),
                                        decode=(decode.url,), port=pick_free_port(), retry_max_retries=1),
                           log_path=logs / "router.log")
    s = Stack(checkpoint, logs, prefill, decode, router, (*timeout, *decode_extra), timeout)
    try:
        wait_healthy(prefill, 120)
        wait_healthy(decode, 120)
        router.start(ready_timeout_s=120)
        yield s
    finally:
        s.stop()
