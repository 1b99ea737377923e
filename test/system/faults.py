"""Helpers of the fault tests: a tiny P + D + router trio, a streaming client that reports how its stream
ended, and waiting until a worker's pools are back at their start values."""

from __future__ import annotations

import contextlib
import http.client
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from sglang_asym.runtime.router_launch import RouterFlavor
from sglang_asym.runtime.server_process import ServerProcess, start_server

from .helpers import router_over, serving

D_TRANSFER_TIMEOUT_S = 5


def pools(server: ServerProcess) -> dict:
    """The worker's pool snapshot (/server_info internal_states[0])."""
    with urllib.request.urlopen(server.url + "/server_info", timeout=10) as resp:
        return json.loads(resp.read())["internal_states"][0]


def wait_pools(server: ServerProcess, expected: dict, timeout_s: float) -> float:
    """Seconds until the worker's pools equal `expected`; AssertionError with the difference after timeout_s."""
    started = time.monotonic()
    while True:
        now = pools(server)
        if now == expected:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            diff = {k: (expected.get(k), now.get(k)) for k in set(now) | set(expected) if now.get(k) != expected.get(k)}
            raise AssertionError(f"{server.mode} pools not back at start after {timeout_s} s: {diff}"[:2000])
        time.sleep(0.2)


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
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
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
    for raw in resp:
        line = raw.decode(errors="replace").strip()
        if line.startswith("data:"):
            return [json.loads(line[5:].strip())]
    raise AssertionError("stream ended before its first event")


@contextlib.contextmanager
def trio(checkpoint: Path, logs: Path, flavor: RouterFlavor = RouterFlavor.SGLANG_ROUTER) -> Iterator[dict]:
    """P, D (transfer timeout D_TRANSFER_TIMEOUT_S) and the router; everything stopped on exit."""
    servers = {"prefill": start_server("asym-prefill", checkpoint, logs, "--transfer-timeout", str(D_TRANSFER_TIMEOUT_S)),
               "decode": start_server("asym-decode", checkpoint, logs, "--transfer-timeout", str(D_TRANSFER_TIMEOUT_S))}
    with serving(servers, timeout_s=120):
        with router_over(servers["prefill"], servers["decode"], flavor) as router:
            yield {**servers, "router": router}
