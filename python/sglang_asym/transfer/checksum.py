"""Per-group CRC32C over a request's rows, in row order, read straight from a pool.

CRC32C (Castagnoli, the `crc32c` package: the CPU's CRC instruction where it has one) guards
against partial, stale or misplaced writes (not against an adversary). Measured here it runs
at ~25 GB/s, about 6x zlib.crc32, and both sides sum every row on the transfer's critical
path (D re-reads every destination row). Rows are fed run by run, so non-contiguous slots
cost one update per contiguous run. `RunningChecksums` folds rows in as they are handed over,
on a thread pool (crc32c, like zlib, releases the GIL while it sums a large buffer), so the
sum is ready when the last write returns.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from crc32c import crc32c
import numpy as np

from sglang_asym.transfer.row_pool import RowPool
from sglang_asym.transfer.runs import coalesce_slots

if TYPE_CHECKING:
    from sglang_asym.transfer.staging import StagingExtent


@dataclass(frozen=True)
class GroupChecksum:
    group: str
    rows: int
    crc32c: int


def crc_rows(pool: RowPool, slots: np.ndarray, crc: int = 0) -> int:
    """Continue `crc` over the rows held in `slots` (in the given order)."""
    return crc_runs(pool, coalesce_slots(slots), crc)


def crc_runs(pool: RowPool, runs: np.ndarray, crc: int = 0) -> int:
    """Continue `crc` over the rows of `runs` ((first slot, number of slots) pairs, in order)."""
    flat, rb = pool.array.data.cast("B"), pool.row_bytes  # byte slices of one memoryview: half numpy's per-run cost
    for start, length in runs.tolist():
        crc = crc32c(flat[start * rb:(start + length) * rb], crc)
    return crc


def checksum_rows(pool: RowPool, group: str, slots: np.ndarray) -> GroupChecksum:
    return GroupChecksum(group=group, rows=int(len(slots)), crc32c=crc_rows(pool, slots))


class RunningChecksums:
    """Running CRC32C per group of one request over rows handed over in order (`add`), computed
    on `executor`: the ranges of one group are folded one after another, groups in parallel.
    A staged room's rows are read from its staging extent (the same bytes, contiguous)."""

    def __init__(self, executor: Executor, pools: dict[str, RowPool], slots: dict[str, np.ndarray],
                 staging: "StagingExtent | None" = None):
        self._executor, self._pools, self._slots, self._staging = executor, pools, slots, staging
        self._cond = threading.Condition()
        self._queued: dict[str, deque[tuple[int, int]]] = {g: deque() for g in slots}
        self._busy: set[str] = set()           # groups with a drain task queued or running
        self._crc = {g: 0 for g in slots}
        self._rows = {g: 0 for g in slots}     # rows folded in so far
        self._error: BaseException | None = None

    def add(self, group: str, start: int, end: int) -> None:
        """Fold rows [start, end) of `group` in after the rows added before (start must follow them)."""
        with self._cond:
            self._queued[group].append((start, end))
            if group not in self._busy:
                self._busy.add(group)
                self._executor.submit(self._drain, group)

    def _drain(self, group: str) -> None:
        while True:
            with self._cond:
                if not self._queued[group] or self._error is not None:
                    self._busy.discard(group)
                    self._cond.notify_all()
                    return
                start, end = self._queued[group].popleft()
                crc = self._crc[group]
                if start != self._rows[group]:
                    self._error = ValueError(f"group {group!r}: rows [{start}, {end}) do not follow row "
                                             f"{self._rows[group]}")
                    continue
            try:
                if self._staging is None:
                    crc = crc_rows(self._pools[group], self._slots[group][start:end], crc)
                else:
                    crc = crc32c(self._staging.rows(group, self._pools[group].row_bytes, start, end), crc)
            except BaseException as exc:  # reported by result(); the room then fails
                with self._cond:
                    self._error = exc
                continue
            with self._cond:
                self._crc[group], self._rows[group] = crc, end

    def result(self, timeout_s: float | None = None) -> tuple[GroupChecksum, ...]:
        """The sums once every added range is folded in (groups in the order given at creation)."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._busy, timeout_s):
                raise TimeoutError(f"checksums not done within {timeout_s} s")
            if self._error is not None:
                raise RuntimeError(f"checksum failed: {self._error!r}") from self._error
            return tuple(GroupChecksum(g, self._rows[g], self._crc[g]) for g in self._slots)
