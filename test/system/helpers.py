"""Request and process helpers shared by the system tests: prompts, comparable outputs, started servers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any, Callable, Iterator

from harness.server_process import ServerProcess, healthy_on_fresh_ports, post, post_stream

MODEL = "v41-small"  # --served-model-name of every server (smg routes by model name)


def ids(n: int, seed: int) -> list[int]:
    """n deterministic token ids inside every test checkpoint's vocabulary (the tiny one's 512 included), above
    its special ids and below the tiny one's DSpark noise token (500)."""
    return [(seed * 7919 + i * 104729) % 497 + 3 for i in range(n)]


def generate_text(resp: dict) -> Any:
    return resp["text"]


def finish_reason(resp: dict) -> Any:
    return resp["meta_info"]["finish_reason"]


def output(path: str, body: dict, base: str, detail: Callable[[dict], Any] = generate_text):
    """The generated part of a response, streaming or not, in a comparable form: (output_ids,
    detail(last response)) for /generate, the generated text for the OpenAI routes."""
    if body.get("stream"):
        events = post_stream(base + path, body)
        if path == "/generate":
            return events[-1]["output_ids"], detail(events[-1])
        return "".join((e["choices"][0].get("delta", {}).get("content") or e["choices"][0].get("text") or "")
                       for e in events if e.get("choices"))
    status, resp = post(base + path, body)
    assert status == 200, resp
    if path == "/generate":
        return resp["output_ids"], detail(resp)
    choice = resp["choices"][0]
    return choice["text"] if path == "/v1/completions" else choice["message"]["content"]


@contextlib.contextmanager
def serving(servers: dict[str, Any], timeout_s: float = 300) -> Iterator[dict[str, Any]]:
    """The started servers once all are healthy (one whose picked port was taken meanwhile started again on
    fresh ports, in place in the mapping); every one is stopped on exit, also those a case restarted into the
    mapping (its other values, a module's work folders and routers, are left alone)."""
    try:
        for name, server in list(servers.items()):
            if isinstance(server, ServerProcess):
                servers[name] = healthy_on_fresh_ports(server, timeout_s=timeout_s)
        yield servers
    finally:
        stop_all([server for server in servers.values() if isinstance(server, ServerProcess)])


STOP_GRACE_S = 2.0  # a test server's time to exit on SIGTERM before its process group gets SIGKILL


def group_gone(pgid: int, timeout_s: float = 10.0) -> None:
    """Until no process of the group is left (its orphaned children are reaped shortly after the launcher)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"processes of group {pgid} outlived its launcher by {timeout_s} s"
        time.sleep(0.1)


def stop_all(servers: list[ServerProcess], grace_s: float = STOP_GRACE_S) -> None:
    """Stop test servers (their pools already back to empty, so nothing is left to drain): SIGTERM to every
    process group, one shared grace, then SIGKILL to every group, children included. SGLang's launcher answers
    a SIGTERM to its group through its crashed-child path, about 5 s (over 15 s with DSPARK) in every teardown;
    the drain on SIGTERM is the fault module's subject, where the test signals the launcher itself."""
    running = [s for s in servers if s.proc.poll() is None]
    for server in running:
        with contextlib.suppress(ProcessLookupError):  # it exited since the poll
            os.killpg(server.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for server in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(max(deadline - time.monotonic(), 0.01))
    for server in running:
        with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
            os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(15)
