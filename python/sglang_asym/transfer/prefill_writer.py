"""The prefill side's worker tasks: write queued rows with Mooncake, send the completion,
tell D about a failure once no write of ours can still be in flight.

All tasks of all rooms run on one FIFO worker, so a room's writes precede its completion
and its failure notice. Rows handed to send_rows while a write is running accumulate and go
out together in the next batch (adaptive batching: fewer, larger engine calls).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from sglang_asym.transfer.channel import Channel, PeerUnreachableError
from sglang_asym.transfer.checksum import GroupChecksum, crc_spans
from sglang_asym.transfer.config import TransferConfig
from sglang_asym.transfer.engine import MooncakeEngine
from sglang_asym.transfer.errors import UnregisteredMemoryError, WriteFailedError
from sglang_asym.transfer.loops import TaskWorker
from sglang_asym.transfer.messages import PrefillFailed, TransferComplete
from sglang_asym.transfer.poll import KVPoll
from sglang_asym.transfer.prefill_room import PrefillRoom, write_entries
from sglang_asym.transfer.row_pool import RowPool

logger = logging.getLogger(__name__)


class PrefillWriter:
    def __init__(self, config: TransferConfig, engine: MooncakeEngine, pools: dict[str, RowPool], channel: Channel,
                 lock: threading.RLock, fail: Callable[[PrefillRoom, str], None]):
        self._config, self._engine, self._pools, self._channel = config, engine, pools, channel
        self._lock, self._fail = lock, fail
        self._worker = TaskWorker("prefill-transfer-worker")
        self._checksums = ThreadPoolExecutor(config.checksum_threads, thread_name_prefix="prefill-crc")

    # ---- scheduling (caller holds the lock) ----------------------------------------------
    def queue_rows(self, room: PrefillRoom) -> None:
        if room.pending_ranges and not room.flush_queued:
            room.flush_queued = True
            self._submit(room, self._flush)

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
            parts = [write_entries(room, self._pools[g], g, s, e) for g, s, e in ranges]
            spans: dict[str, list[tuple[int, int]]] = {}
            for g, s, e in ranges:
                spans.setdefault(g, []).append((s, e))
            start_crcs = {g: room.crcs[g] for g in spans}
        what = ", ".join(f"group {g!r} rows [{s}, {e})" for g, s, e in ranges)
        src, dst, lengths = (np.concatenate([p[i] for p in parts]) for i in range(3))
        # CRCs read the same source rows while the engine sends them (the write releases the GIL;
        # starting them earlier would make this thread queue for the GIL behind them).
        crcs = {g: self._checksums.submit(crc_spans, self._pools[g], room.source_slots[g], sp, start_crcs[g])
                for g, sp in spans.items()}
        started = time.perf_counter()
        try:
            self._engine.write(session, src, dst, lengths, max_entries=self._config.max_batch_entries)
        except UnregisteredMemoryError as exc:
            with self._lock:
                self._fail(room, f"refusing to write {what}: {exc}")
            return
        except WriteFailedError as exc:
            with self._lock:
                room.write_failed = True
                self._fail(room, f"writing {what} to decode failed: {exc}")
            return
        wrote = time.perf_counter() - started
        with self._lock:
            for g, sp in spans.items():
                room.crcs[g], room.written[g] = crcs[g].result(), sp[-1][1]
        logger.debug("bootstrap_room=%d: wrote %d B in %d entries in %.2f ms (+%.2f ms for the CRCs)", room.room,
                     int(lengths.sum()), len(lengths), wrote * 1e3, (time.perf_counter() - started - wrote) * 1e3)

    def _complete(self, room: PrefillRoom) -> None:
        with self._lock:
            if room.state == KVPoll.Failed:
                return
            sums = tuple(GroupChecksum(g.name, room.written[g.name], room.crcs[g.name]) for g in room.manifest.groups)
            endpoint = room.request.decode_endpoint
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
