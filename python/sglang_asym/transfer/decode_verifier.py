"""D's check of P's completion: re-read the destination rows, compare their CRCs with P's.

Runs as soon as the completion arrives, without a hop through the decode worker: a small
payload (most requests) is summed right on the service thread; a large one is split by
group over the CRC threads, and the thread that sums the last group reports the verdict.
The rows are read only after P's completion, i.e. after its last write returned, so the
check covers their final state. A staged room's rows are read in its landing extent.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Executor
from typing import Callable

from crc32c import crc32c

from sglang_asym.transfer.checksum import crc_runs
from sglang_asym.transfer.decode_room import DecodeRoom, completion_problem, crc_problem, landed_rows
from sglang_asym.transfer.extents import ExtentBuffer
from sglang_asym.transfer.messages import TransferComplete
from sglang_asym.transfer.row_pool import RowPool

logger = logging.getLogger(__name__)

# Up to this, one inline pass beats the thread fan-out: measured on 2 cores with zlib.crc32, 1.7 MB
# took ~0.6 ms inline and ~1.4 ms split over the CRC threads; with CRC32C the inline re-read of
# freshly written rows runs at ~5-6 GB/s (memory, not the CRC, bounds it), ~0.3 ms for 1.7 MB.
INLINE_VERIFY_BYTES = 4 << 20

Verdict = Callable[[DecodeRoom, TransferComplete, "str | None"], None]


class CompletionVerifier:
    def __init__(self, pools: dict[str, RowPool], executor: Executor, conclude: Verdict,
                 landing: ExtentBuffer | None = None):
        self._pools, self._executor, self._conclude, self._landing = pools, executor, conclude, landing

    def start(self, room: DecodeRoom, msg: TransferComplete) -> None:
        """Check `msg` for `room`; calls conclude(room, msg, problem_or_None) exactly once."""
        problem = completion_problem(room, msg)
        groups = [g for g in room.manifest.groups if g.num_rows]
        if problem is not None or not groups:
            self._conclude(room, msg, problem)
            return
        if room.manifest.total_bytes <= INLINE_VERIFY_BYTES or len(groups) == 1:
            crcs = {g.name: self._crc(room, g.name) for g in groups}
            self._conclude(room, msg, crc_problem(msg, _with_empty(room, crcs)))
            return
        tally = _Tally(len(groups))
        for g in sorted(groups, key=lambda g: -g.nbytes):  # largest first: the groups finish together
            self._executor.submit(self._sum_group, room, msg, g.name, tally)

    def _sum_group(self, room: DecodeRoom, msg: TransferComplete, group: str, tally: "_Tally") -> None:
        try:
            crc: int | BaseException = self._crc(room, group)
        except BaseException as exc:  # reported as the room's failure, never swallowed
            crc = exc
        crcs = tally.add(group, crc)
        if crcs is None:
            return
        errors = [c for c in crcs.values() if isinstance(c, BaseException)]
        problem = f"internal error while checking the rows: {errors[0]!r}" if errors else \
            crc_problem(msg, _with_empty(room, crcs))
        try:
            self._conclude(room, msg, problem)
        except Exception:  # an executor would swallow it silently
            logger.exception("concluding bootstrap_room=%d failed", room.room)

    def _crc(self, room: DecodeRoom, group: str) -> int:
        if room.landing is None:
            return crc_runs(self._pools[group], room.runs(group))
        assert self._landing is not None
        return crc32c(landed_rows(room, self._landing, group))


def _with_empty(room: DecodeRoom, crcs: dict) -> dict:
    return {g.name: crcs.get(g.name, 0) for g in room.manifest.groups}  # crc32 of no rows is 0


class _Tally:
    """Collects per-group results from several threads; the last one gets them all."""

    def __init__(self, expected: int):
        self._expected, self._lock, self._crcs = expected, threading.Lock(), {}

    def add(self, group: str, crc) -> dict | None:
        with self._lock:
            self._crcs[group] = crc
            return dict(self._crcs) if len(self._crcs) == self._expected else None
