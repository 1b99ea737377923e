"""Per-group CRC32 over a request's rows, in row order, read straight from a pool.

CRC32 (zlib) guards against partial, stale or misplaced writes (not against an adversary)
and runs at memory-ish speed; rows are fed run by run, so non-contiguous slots cost one
update per contiguous run.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from sglang_asym.transfer.row_pool import RowPool
from sglang_asym.transfer.runs import coalesce_slots


@dataclass(frozen=True)
class GroupChecksum:
    group: str
    rows: int
    crc32: int


def crc_rows(pool: RowPool, slots: np.ndarray, crc: int = 0) -> int:
    """Continue `crc` over the rows held in `slots` (in the given order)."""
    view = pool.array
    for start, length in coalesce_slots(slots):
        crc = zlib.crc32(view[start:start + length].data, crc)
    return crc


def checksum_rows(pool: RowPool, group: str, slots: np.ndarray) -> GroupChecksum:
    return GroupChecksum(group=group, rows=int(len(slots)), crc32=crc_rows(pool, slots))


def crc_spans(pool: RowPool, slots: np.ndarray, spans: list[tuple[int, int]], crc: int) -> int:
    """Continue `crc` over rows [s, e) of `slots` for each span, in order."""
    for start, end in spans:
        crc = crc_rows(pool, slots[start:end], crc)
    return crc
