"""The prefill side's worker tasks: write queued rows with Mooncake, send the completion,
tell D about a failure once no write of ours can still be in flight.

All tasks of all rooms run on one FIFO worker, so a room's writes precede its completion
and its failure notice. At the handshake, with the worker idle, the service thread itself
submits the first entries of the rows already handed over (no thread hop before the bytes
move); the worker waits for them as the room's first task. Rows handed to send_rows while a
write is running accumulate and go out together in the next batch (adaptive batching: fewer,
larger engine calls). Their CRCs are folded in on a thread pool from the moment send_rows
hands them over, so the completion goes out as soon as the last write returns.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from sglang_asym.transfer.channel import Channel, PeerUnreachableError
from sglang_asym.transfer.checksum import RunningChecksums
from sglang_asym.transfer.config import TransferConfig
from sglang_asym.transfer.engine import MooncakeEngine, PendingWrite
from sglang_asym.transfer.errors import UnregisteredMemoryError, WriteFailedError
from sglang_asym.transfer.loops import TaskWorker
from sglang_asym.transfer.messages import PrefillFailed, TransferComplete
from sglang_asym.transfer.poll import KVPoll
from sglang_asym.transfer.prefill_room import PrefillRoom, batch_entries
from sglang_asym.transfer.row_pool import RowPool

logger = logging.getLogger(__name__)

INLINE_SUBMIT_ENTRIES = 128  # entries the binding thread submits itself (~5 us each), the rest on the worker
# A finished room's write up to this size is waited for on the binding thread, and the completion
# leaves from there: waking the worker while the transport's threads hold both cores of a small machine
# cost ~0.8 ms per 342 KB room (measured). The wait is bounded, so a frozen decode peer cannot keep the
# service thread (heartbeats, other rooms) from its work: after INLINE_WAIT_S the worker takes over.
INLINE_WRITE_BYTES = 4 << 20
INLINE_WAIT_S = 0.05


class PrefillWriter:
    def __init__(self, config: TransferConfig, engine: MooncakeEngine, pools: dict[str, RowPool], channel: Channel,
                 lock: threading.RLock, fail: Callable[[PrefillRoom, str], None]):
        self._config, self._engine, self._pools, self._channel = config, engine, pools, channel
        self._lock, self._fail = lock, fail
        self._worker = TaskWorker("prefill-transfer-worker")
        self._checksums = ThreadPoolExecutor(config.checksum_threads, thread_name_prefix="prefill-crc")

    def checksums_for(self, room: PrefillRoom) -> RunningChecksums:
        return RunningChecksums(self._checksums, self._pools, room.source_slots, room.staging)

    # ---- scheduling (caller holds the lock) ----------------------------------------------
    def queue_rows(self, room: PrefillRoom) -> None:
        if room.pending_ranges and not room.flush_queued:
            room.flush_queued = True
            self._submit(room, self._flush)

    def start_rows(self, room: PrefillRoom) -> bool:
        """`queue_rows` for a room that was just bound (no earlier task of it exists). When the worker
        is idle, the caller prepares the entries and submits the first INLINE_SUBMIT_ENTRIES itself,
        so the bytes move while the worker wakes up; the worker then drives the rest of the write,
        in the same FIFO place. With the worker busy, only one write stays in flight: it queues.
        A finished room of at most INLINE_WRITE_BYTES is waited for right here instead (up to
        INLINE_WAIT_S, then the worker waits for the rest); True when it ended here: its completion
        may then leave from the caller too (`complete_now`)."""
        if not room.pending_ranges or room.flush_queued or not self._worker.idle:
            self.queue_rows(room)
            return False
        ranges, room.pending_ranges = room.pending_ranges, []
        src, dst, lengths = batch_entries(room, self._pools, ranges)
        try:
            pending = self._engine.start_write(room.request.decode_session, src, dst, lengths,
                                               self._config.max_batch_entries, submit_now=INLINE_SUBMIT_ENTRIES)
        except UnregisteredMemoryError as exc:
            self._fail(room, f"refusing to write {_describe(ranges)}: {exc}")
            return False
        if room.finished and int(lengths.sum()) <= INLINE_WRITE_BYTES:
            if self._finish_flush(room, ranges, pending, max_wait_s=INLINE_WAIT_S):
                return True

        def _finish_started_flush(r: PrefillRoom) -> None:
            self._finish_flush(r, ranges, pending)

        self._submit(room, _finish_started_flush)
        return False

    def complete_now(self, room: PrefillRoom) -> None:
        """The completion of a room whose rows `start_rows` wrote to the end, from the caller."""
        self._complete(room)

    def queue_complete(self, room: PrefillRoom) -> None:
        self._submit(room, self._complete)

    def queue_failure_notice(self, room: PrefillRoom) -> None:
        self._submit(room, self._notify_failed)

    def _submit(self, room: PrefillRoom, task: Callable[[PrefillRoom], None]) -> None:
        room.pending_tasks += 1

        def run() -> None:
            try:
                task(room)
            except Exception as exc:  # never leave a room hanging on a bug
                logger.exception("prefill transfer task failed")
                with self._lock:
                    self._fail(room, f"internal error in transfer task: {exc!r}")
            finally:
                with self._lock:
                    room.pending_tasks -= 1

        run.__name__ = task.__name__
        self._worker.submit(run)

    # ---- tasks ---------------------------------------------------------------------------
    def _flush(self, room: PrefillRoom) -> None:
        with self._lock:
            room.flush_queued = False
            ranges, room.pending_ranges = room.pending_ranges, []
            if room.state == KVPoll.Failed or not ranges:
                return
            session = room.request.decode_session
            src, dst, lengths = batch_entries(room, self._pools, ranges)
        try:
            pending = self._engine.start_write(session, src, dst, lengths, self._config.max_batch_entries,
                                               submit_now=0)
        except UnregisteredMemoryError as exc:
            with self._lock:
                self._fail(room, f"refusing to write {_describe(ranges)}: {exc}")
            return
        self._finish_flush(room, ranges, pending)

    def _finish_flush(self, room: PrefillRoom, ranges: list[tuple[str, int, int]], pending: PendingWrite,
                      max_wait_s: float | None = None) -> bool:
        """Wait for a started write (always, even if the room failed meanwhile: it drains what is in
        flight before the room's later tasks run). With max_wait_s: False if it is still in flight
        then (nothing recorded yet; wait again later), else True."""
        started = time.perf_counter()
        try:
            if not self._engine.finish_write(pending, max_wait_s):
                return False
        except WriteFailedError as exc:
            with self._lock:
                room.write_failed = True
                self._fail(room, f"writing {_describe(ranges)} to decode failed: {exc}")
            return True
        with self._lock:
            for g, _, e in ranges:
                room.written[g] = e
        logger.debug("bootstrap_room=%d: wrote %d B in %d entries, the last %.2f ms waited for here", room.room,
                     sum(pending.lengths), len(pending.lengths), (time.perf_counter() - started) * 1e3)
        return True

    def _complete(self, room: PrefillRoom) -> None:
        with self._lock:
            if room.state == KVPoll.Failed:
                return
            endpoint = room.request.decode_endpoint
        try:  # every row was declared before finish(): this waits only for the CRC still running
            sums = room.checksums.result(timeout_s=self._config.waiting_timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            with self._lock:
                self._fail(room, f"cannot checksum the source rows: {exc}")
            return
        with self._lock:
            if room.state == KVPoll.Failed:
                return
            unwritten = [f"{c.group} ({room.written[c.group]}/{c.rows})" for c in sums
                         if room.written[c.group] != c.rows]
            if unwritten:  # cannot happen: FIFO puts every write before the completion
                self._fail(room, f"internal error: completion before rows were written: {unwritten}")
                return
        try:
            self._channel.send(endpoint, TransferComplete(room.room, sums))
        except PeerUnreachableError as exc:
            with self._lock:
                self._fail(room, f"cannot send completion to decode: {exc}")

    def _notify_failed(self, room: PrefillRoom) -> None:
        # Runs after every earlier task of the room: no write of ours is still in flight,
        # unless one returned -1 (Mooncake may still deliver part of it).
        with self._lock:
            msg = PrefillFailed(room.room, room.reason, writes_stopped=not room.write_failed)
            endpoint = room.request.decode_endpoint
        self._channel.try_send(endpoint, msg)

    def stop(self) -> None:
        self._worker.stop()
        self._checksums.shutdown()


def _describe(ranges: list[tuple[str, int, int]]) -> str:
    return ", ".join(f"group {g!r} rows [{s}, {e})" for g, s, e in ranges)
