"""Thin wrapper around Mooncake's TransferEngine: return codes become exceptions.

One engine per process (teardown takes about a second and an engine created before fork
hangs in the child). Create it only after the worker process started (spawn).
Facts this wrapper relies on (mooncake 0.3.13, TCP): `batch_transfer_sync_write` returns 0
or -1 and releases the GIL; -1 may leave the destination PARTIALLY written; more than ~2048
queued entries per peer fail unless the queue env limits are raised; a frozen peer blocks
for MC_TRANSFER_TIMEOUT / MC_TCP_*_TIMEOUT_SEC seconds, and the bytes of that timed-out write
still land once the peer resumes. Measured here as well: a batch the SERVER rejects (an
address outside its registered memory) with many entries can leave the lanes to that peer
failing for seconds or for good; P therefore checks D's slot ranges before writing.

`batch_transfer_sync_write` busy-spins the calling thread until the batch is done: on a small
machine that core is taken from the transport threads that move the bytes (measured on 2
cores: a 29 MB write took about 1.5x longer than the same entries submitted one by one and
polled with short sleeps; and routing only writes <= 4 MiB through it, on the prefill worker,
made the benchmark's transfer phase slower too: N=2048 6.4 ms vs 4.0-4.6 ms, N=512 2.3-2.6 ms
vs 1.7-2.5 ms). `write` therefore submits each entry with `transfer_submit_write`
and polls `transfer_check_status`, which frees an entry's batch once it returns 1 or -1 (so
a terminal entry is never polled again) and never frees one that returns -2 or is pending.
`start_write` + `finish_write` split `write` in two, so one thread can set the bytes moving and
another wait for them. `write_batch_sync` keeps the engine's own batch call (the benchmark's
bare baseline).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from sglang_asym.transfer.errors import EngineError, WriteFailedError
from sglang_asym.transfer.regions import RegisteredRegions

PEER_QUEUE_ENV = ("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER")
TIMEOUT_ENV = ("MC_TRANSFER_TIMEOUT", "MC_TCP_STATUS_TIMEOUT_SEC", "MC_TCP_PROGRESS_TIMEOUT_SEC")
_SUBMIT_FAILED = (-1, (1 << 64) - 1, 0)   # transfer_submit_write's failure values (batch ids are pointers)
_DONE, _PENDING, _FAILED = 1, 0, -1       # transfer_check_status; -2 (timeout) counts as failed
POLL_MIN_S, POLL_MAX_S = 50e-6, 1e-3      # sleep between polls: about a quarter of the expected rest
POLL_BYTES_PER_S = 4e9                    # optimistic transport speed, so the sleeps stay short
SLOWEST_BYTES_PER_S = float(1 << 30)      # no progress for write_timeout_s + 1 s per GiB in flight: failed

logger = logging.getLogger(__name__)


@dataclass
class EngineStats:
    batches: int = 0
    entries: int = 0
    bytes: int = 0
    failed_batches: int = 0
    largest_batch: int = 0   # most entries ever submitted in one batch call


def configure_environment(host: str, write_timeout_s: int) -> None:
    """Mooncake reads its limits from the environment when the engine starts."""
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", host)
    for name in PEER_QUEUE_ENV:
        os.environ.setdefault(name, "65535")
    for name in TIMEOUT_ENV:
        os.environ[name] = str(write_timeout_s)


_live_engines = 0  # per process; one is the rule (see the module docstring)
_live_lock = threading.Lock()


class MooncakeEngine:
    """Writes use `batch_transfer_sync_write` only: no batch ids, so the fatal double
    `get_batch_transfer_status` on one id cannot happen."""

    def __init__(self, host: str = "127.0.0.1", write_timeout_s: int = 5, protocol: str = "tcp"):
        global _live_engines
        with _live_lock:
            if _live_engines:
                raise EngineError("a Mooncake engine already exists in this process (use one per process)")
            _live_engines += 1
        try:
            self._start(host, write_timeout_s, protocol)
        except BaseException:
            with _live_lock:
                _live_engines -= 1
            raise

    def _start(self, host: str, write_timeout_s: int, protocol: str) -> None:
        configure_environment(host, write_timeout_s)
        from mooncake.engine import TransferEngine  # imported late: needs libibverbs.so.1

        self._engine = TransferEngine()
        rc = self._engine.initialize(host, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise EngineError(f"Mooncake initialize({host!r}, P2PHANDSHAKE, {protocol!r}) returned {rc}")
        self.session_id = f"{host}:{self._engine.get_rpc_port()}"
        self.regions = RegisteredRegions()
        self.stats = EngineStats()
        self._stats_lock = threading.Lock()
        self._timeout_s = float(write_timeout_s)
        self._stragglers: list[int] = []   # ids still in flight after a failed write (polled to free them)
        self._stragglers_lock = threading.Lock()

    def register(self, ptr: int, nbytes: int) -> None:
        self.regions.add(ptr, nbytes)
        rc = self._engine.register_memory(ptr, nbytes)
        if rc != 0:
            self.regions.remove(ptr)
            raise EngineError(f"Mooncake register_memory({ptr:#x}, {nbytes}) returned {rc}")

    def unregister(self, ptr: int) -> None:
        rc = self._engine.unregister_memory(ptr)
        self.regions.remove(ptr)
        if rc != 0:
            raise EngineError(f"Mooncake unregister_memory({ptr:#x}) returned {rc}")

    def write(self, session: str, src_ptrs: np.ndarray, dst_ptrs: np.ndarray, lengths: np.ndarray,
              max_entries: int) -> None:
        """Write every (src, dst, length) entry to `session`, with at most max_entries entries in
        flight (a sliding window: no pause between batches), waiting without spinning a core.
        In the stats every max_entries entries count as one batch.

        Raises UnregisteredMemoryError before any byte moves if a source range is not
        registered, and WriteFailedError on the first failed entry, or when no entry finished
        for write_timeout_s + 1 s per GiB in flight (entries may still be in flight then: the
        destination may be partially written, and written later).
        """
        self.finish_write(self.start_write(session, src_ptrs, dst_ptrs, lengths, max_entries, submit_now=0))

    def start_write(self, session: str, src_ptrs: np.ndarray, dst_ptrs: np.ndarray, lengths: np.ndarray,
                    max_entries: int, submit_now: int) -> "PendingWrite":
        """The first half of `write`: check the sources (UnregisteredMemoryError before any byte
        moves) and submit up to `submit_now` entries without waiting, so the bytes start moving
        before the caller hands the rest to another thread. Every started write must go through
        `finish_write`, even after a refused submit (it reports that, and frees what is in flight)."""
        self.regions.check(src_ptrs, lengths)
        self._reap_stragglers()
        pending = PendingWrite(session, src_ptrs.tolist(), dst_ptrs.tolist(), lengths.tolist(), max_entries)
        pending.submit(self._engine.transfer_submit_write, min(submit_now, max_entries))
        return pending

    def finish_write(self, pending: "PendingWrite", max_wait_s: float | None = None) -> bool:
        """The rest of `write`: submit and poll until every entry is done; raises like `write`.
        With max_wait_s, gives up waiting after that long and returns False: the write is still in
        flight, and some thread must call finish_write on it again. True once it is done."""
        problem = self._write_entries(pending, max_wait_s)
        done = pending.done
        if problem is None and done < len(pending.lengths):
            return False
        n, max_entries, session = len(pending.lengths), pending.max_entries, pending.session
        with self._stats_lock:
            self.stats.batches += -(-n // max_entries)
            self.stats.largest_batch = max(self.stats.largest_batch, min(n, max_entries))
            self.stats.entries += done
            self.stats.bytes += sum(pending.lengths[:done])  # `done` counts a prefix of the entries
            self.stats.failed_batches += problem is not None
        if problem is not None:
            raise WriteFailedError(f"Mooncake batch write to {session} {problem} ({done} of {n} entries done); "
                                   f"destination may be partially written")
        return True

    def write_batch_sync(self, session: str, src_ptrs: np.ndarray, dst_ptrs: np.ndarray, lengths: np.ndarray,
                         max_entries: int) -> None:
        """The same contract as `write`, through the engine's own `batch_transfer_sync_write`
        (one call per <= max_entries entries; the calling thread spins while it waits)."""
        self.regions.check(src_ptrs, lengths)
        for lo, hi in self._windows(len(lengths), max_entries):
            rc = self._engine.batch_transfer_sync_write(
                session, src_ptrs[lo:hi].tolist(), dst_ptrs[lo:hi].tolist(), lengths[lo:hi].tolist())
            self._account(lo, hi, lengths, rc == 0)
            if rc != 0:
                raise WriteFailedError(
                    f"Mooncake batch write to {session} returned {rc} (entries {lo}..{hi} of {len(lengths)}); "
                    f"destination may be partially written")

    @staticmethod
    def _windows(n: int, max_entries: int) -> list[tuple[int, int]]:
        return [(lo, min(lo + max_entries, n)) for lo in range(0, n, max_entries)]

    def _account(self, lo: int, hi: int, lengths: np.ndarray, ok: bool) -> None:
        with self._stats_lock:
            self.stats.batches += 1
            self.stats.largest_batch = max(self.stats.largest_batch, hi - lo)
            if ok:
                self.stats.entries += hi - lo
                self.stats.bytes += int(lengths[lo:hi].sum())
            else:
                self.stats.failed_batches += 1

    def _write_entries(self, w: "PendingWrite", max_wait_s: float | None = None) -> str | None:
        """Submit while fewer than max_entries are in flight; poll the oldest; count finished entries
        in w.done. Returns None (done, or max_wait_s passed first) or what went wrong."""
        submit, check = self._engine.transfer_submit_write, self._engine.transfer_check_status
        in_flight = w.in_flight
        last_progress = w.last_progress = w.last_progress or time.monotonic()
        give_up = None if max_wait_s is None else time.monotonic() + max_wait_s
        while w.problem is None and (w.submitted < len(w.lengths) or in_flight):
            w.submit(submit, w.max_entries)
            if w.problem is not None or not in_flight:
                continue
            batch_id, nbytes = in_flight[0]
            status = check(batch_id)
            if status == _DONE:
                in_flight.popleft()
                w.in_flight_bytes -= nbytes
                w.done += 1
                last_progress = w.last_progress = time.monotonic()
            elif status != _PENDING:
                in_flight.popleft()  # -1 freed it; -2 (timeout) is never freed by the engine: leaked
                w.problem = "returned -1" if status == _FAILED else f"returned {status} (entry timed out)"
            elif time.monotonic() - last_progress > self._timeout_s + w.in_flight_bytes / SLOWEST_BYTES_PER_S:
                w.problem = f"returned -1 (no entry finished for {self._timeout_s:g} s + 1 s per GiB in flight)"
            elif give_up is not None and time.monotonic() > give_up:
                return None
            else:
                time.sleep(min(POLL_MAX_S, max(POLL_MIN_S, w.in_flight_bytes / POLL_BYTES_PER_S / 4)))
        if in_flight:
            with self._stragglers_lock:
                self._stragglers.extend(batch_id for batch_id, _ in in_flight)
            in_flight.clear()
        return w.problem

    def _reap_stragglers(self) -> None:
        """Poll entries left in flight by a failed write once each: terminal ones free their batch."""
        with self._stragglers_lock:
            if not self._stragglers:
                return
            still = [b for b in self._stragglers if self._engine.transfer_check_status(b) == _PENDING]
            if len(still) < len(self._stragglers):
                logger.debug("%d earlier in-flight entries ended", len(self._stragglers) - len(still))
            self._stragglers = still

    def close(self) -> None:
        global _live_engines
        if self._engine is not None:
            self._engine = None  # the pybind object tears down its threads in its destructor
            with _live_lock:
                _live_engines -= 1


class PendingWrite:
    """Entries of one write and how far their submission got (a sliding window of max_entries)."""

    def __init__(self, session: str, src: list[int], dst: list[int], lengths: list[int], max_entries: int):
        self.session, self.src, self.dst, self.lengths, self.max_entries = session, src, dst, lengths, max_entries
        self.in_flight: deque[tuple[int, int]] = deque()   # (batch id, bytes), oldest first
        self.in_flight_bytes = self.submitted = self.done = 0   # done: entries finished, in order
        self.last_progress = 0.0                                   # monotonic time an entry last finished
        self.problem: str | None = None

    def submit(self, submit, window: int) -> None:
        """Submit entries in order while fewer than `window` are in flight."""
        while self.submitted < len(self.lengths) and len(self.in_flight) < window:
            i = self.submitted
            batch_id = submit(self.session, self.src[i], self.dst[i], self.lengths[i])
            if batch_id in _SUBMIT_FAILED:
                self.problem = "returned -1 (submit refused)"
                return
            self.in_flight.append((batch_id, self.lengths[i]))
            self.in_flight_bytes += self.lengths[i]
            self.submitted += 1
