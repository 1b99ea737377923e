"""Bookkeeping of memory regions registered with the engine.

Over TCP Mooncake accepts an unregistered SOURCE buffer (RDMA would reject it), so CPU
tests cannot catch a missing registration; this table lets the writer check every source
range in code before it submits a batch.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

from sglang_asym.transfer.errors import UnregisteredMemoryError

SMALL_CHECK = 8  # up to this many ranges, a Python loop beats numpy's per-call cost


class RegisteredRegions:
    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._lock = threading.Lock()

    def add(self, ptr: int, nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError(f"cannot register {nbytes} bytes at {ptr:#x}")
        with self._lock:
            i = bisect.bisect_left(self._starts, ptr)
            overlaps_prev = i > 0 and self._ends[i - 1] > ptr
            overlaps_next = i < len(self._starts) and self._starts[i] < ptr + nbytes
            if overlaps_prev or overlaps_next:
                raise ValueError(f"region [{ptr:#x}, +{nbytes}) overlaps a registered region")
            self._starts.insert(i, ptr)
            self._ends.insert(i, ptr + nbytes)

    def remove(self, ptr: int) -> None:
        with self._lock:
            i = bisect.bisect_left(self._starts, ptr)
            if i == len(self._starts) or self._starts[i] != ptr:
                raise ValueError(f"no registered region starts at {ptr:#x}")
            del self._starts[i], self._ends[i]

    def contains(self, ptr: int) -> bool:
        """Whether a region starts exactly at `ptr`."""
        with self._lock:
            i = bisect.bisect_left(self._starts, ptr)
            return i < len(self._starts) and self._starts[i] == ptr

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(end - start for start, end in zip(self._starts, self._ends))

    def check(self, ptrs: np.ndarray, lengths: np.ndarray) -> None:
        """Raise unless every [ptr, ptr + length) lies inside one registered region."""
        if len(ptrs) <= SMALL_CHECK:
            self._check_few(ptrs, lengths)
            return
        ptrs, lengths = np.asarray(ptrs, dtype=np.uint64), np.asarray(lengths, dtype=np.uint64)
        with self._lock:
            starts = np.asarray(self._starts, dtype=np.uint64)
            ends = np.asarray(self._ends, dtype=np.uint64)
        idx = np.searchsorted(starts, ptrs, side="right").astype(np.int64) - 1
        inside = idx >= 0
        safe = np.clip(idx, 0, None)
        if len(starts):
            inside &= ptrs + lengths <= ends[safe]
        else:
            inside[:] = False
        if not inside.all():
            bad = int(np.flatnonzero(~inside)[0])
            self._refuse(int(ptrs[bad]), int(lengths[bad]), len(starts))

    def _check_few(self, ptrs, lengths) -> None:
        """`check` for a handful of ranges (a staged write): bisect over Python ints, no numpy."""
        with self._lock:
            for ptr, length in zip(map(int, ptrs), map(int, lengths)):
                i = bisect.bisect_right(self._starts, ptr) - 1
                if i < 0 or ptr + length > self._ends[i]:
                    self._refuse(ptr, length, len(self._starts))

    @staticmethod
    def _refuse(ptr: int, length: int, registered: int) -> None:
        raise UnregisteredMemoryError(f"source range [{ptr:#x}, +{length}) is not inside a registered "
                                      f"memory region ({registered} registered)")
