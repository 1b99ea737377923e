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
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from sglang_asym.transfer.errors import EngineError, WriteFailedError
from sglang_asym.transfer.regions import RegisteredRegions

PEER_QUEUE_ENV = ("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER")
TIMEOUT_ENV = ("MC_TRANSFER_TIMEOUT", "MC_TCP_STATUS_TIMEOUT_SEC", "MC_TCP_PROGRESS_TIMEOUT_SEC")


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
        """Write every (src, dst, length) entry to `session`, in batches of <= max_entries.

        Raises UnregisteredMemoryError before any byte moves if a source range is not
        registered, and WriteFailedError on the first batch that returns -1.
        """
        self.regions.check(src_ptrs, lengths)
        for lo in range(0, len(lengths), max_entries):
            hi = min(lo + max_entries, len(lengths))
            rc = self._engine.batch_transfer_sync_write(
                session, src_ptrs[lo:hi].tolist(), dst_ptrs[lo:hi].tolist(), lengths[lo:hi].tolist())
            with self._stats_lock:
                self.stats.batches += 1
                self.stats.largest_batch = max(self.stats.largest_batch, hi - lo)
                if rc != 0:
                    self.stats.failed_batches += 1
                else:
                    self.stats.entries += hi - lo
                    self.stats.bytes += int(lengths[lo:hi].sum())
            if rc != 0:
                raise WriteFailedError(
                    f"Mooncake batch write to {session} returned {rc} (entries {lo}..{hi} of {len(lengths)}); "
                    f"destination may be partially written")

    def close(self) -> None:
        global _live_engines
        if self._engine is not None:
            self._engine = None  # the pybind object tears down its threads in its destructor
            with _live_lock:
                _live_engines -= 1
