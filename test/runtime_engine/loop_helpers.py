"""Running a DecodeLoop to completion in tests: start, wait for every request, stop, check no page leaked."""

from __future__ import annotations

import threading

from sglang_asym.cache import CacheSet
from sglang_asym.runtime.engine.decode_loop import DecodeLoop


def run_until_done(loop: DecodeLoop, done: threading.Event, cache_set: CacheSet, timeout_s: float = 120.0) -> None:
    """Start `loop`, wait until `done` is set (every submitted request finished), stop the loop even when
    the wait fails, then check the loop's cache set holds no page."""
    loop.start()
    try:
        assert done.wait(timeout_s), f"the decode loop did not finish its requests within {timeout_s:g} s"
    finally:
        loop.stop()
    cache_set.check_no_leak()
