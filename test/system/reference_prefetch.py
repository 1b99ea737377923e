"""The in-process reference computed beside the servers: a system test module hands every reference it will
compare with to one background thread when the module starts, and each case waits for the ones it needs.

A pair's servers mostly compute one at a time (P's prefix, then D's window and decode steps), and a case used
to compute its reference only after the servers answered, so one core idled through either part. The thread
computes the references, in the order the cases ask for them, while the servers start and answer; a case
compares the servers' tokens with exactly the tokens it compared before. One thread, because the reference
model keeps per-forward state (its captured rows, the layers it ran) and is not safe to share between threads.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Hashable


class ReferencePrefetch:
    """Reference results by key, each computed once, in submission order, on one background thread."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reference")
        self._futures: dict[Hashable, concurrent.futures.Future] = {}

    def submit(self, key: Hashable, compute: Callable[[], Any]) -> None:
        """Queues `compute` under `key` (a key already queued keeps its first computation)."""
        if key not in self._futures:
            self._futures[key] = self._pool.submit(compute)

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The result for `key`: the queued computation's (waited for; its exception re-raised here), or
        `compute` queued now and waited for, if nothing was queued under `key`."""
        self.submit(key, compute)
        return self._futures[key].result()

    def close(self) -> None:
        """Drops what has not started; waits for the computation running now (the thread cannot be interrupted)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "ReferencePrefetch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
