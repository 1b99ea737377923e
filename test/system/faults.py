"""Client helpers of the fault tests: a streaming client that reports how its stream ended, /abort_request and
/health_generate calls, and recording measured times into benchmark/results/reliability.json."""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from harness.sse_lines import data_payloads


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


def send_stream(url: str, body: dict) -> http.client.HTTPConnection:
    """A streaming /generate sent without waiting for the response's headers."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    return conn


def abort(url: str, rid: str) -> int:
    """SGLang's /abort_request for request `rid` on one server; its HTTP status."""
    req = urllib.request.Request(url + "/abort_request", data=json.dumps({"rid": rid}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def wait_draining(url: str, timeout_s: float = 10.0) -> float:
    """Seconds until a server's /health answers 503 after SIGTERM (SGLang marks it exiting in its signal handler,
    and from then on the server refuses new requests, shared/drain.py)."""
    started = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"{url}/health still not 503 {timeout_s} s after SIGTERM"
        time.sleep(0.05)


def health_generate(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health_generate", timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


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
