"""A running worker's pool snapshot read over HTTP, and the wait for it to return to a start value
(fault tests and the soak benchmark compare every counter of /server_info `internal_states[0]`)."""

from __future__ import annotations

import json
import time
import urllib.request

__all__ = ["read_pools", "wait_pools_back"]


def read_pools(url: str) -> dict:
    """The worker's pool snapshot (/server_info internal_states[0]: pages, slots, extents, rooms, Mooncake)."""
    with urllib.request.urlopen(url + "/server_info", timeout=10) as resp:
        return json.loads(resp.read())["internal_states"][0]


def wait_pools_back(url: str, expected: dict, timeout_s: float, label: str | None = None) -> float:
    """Seconds until the worker's pools equal `expected`; AssertionError naming the difference after timeout_s."""
    started = time.monotonic()
    while True:
        now = read_pools(url)
        if now == expected:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            diff = {k: (expected.get(k), now.get(k)) for k in set(now) | set(expected) if now.get(k) != expected.get(k)}
            raise AssertionError(f"{label or url} pools not back at start after {timeout_s} s: {diff}"[:2000])
        time.sleep(0.2)
