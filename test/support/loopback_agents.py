"""Prefill and decode worker agents for loopback runs (tests, benchmark): each owns one
Mooncake engine, its row pools and its transfer manager, and fills or checks rows with a
deterministic byte pattern so the driver can verify every byte that moved.

Run them with `loopback_rpc.AgentProcess("support.loopback_agents:PrefillAgent", ...)`.
"""

from __future__ import annotations

import os
import time

import numpy as np

from sglang_asym.transfer.bootstrap import BootstrapServer
from sglang_asym.transfer.compat import TransferCompat
from sglang_asym.transfer.config import TransferConfig
from sglang_asym.transfer.decode_manager import DecodeTransferManager
from sglang_asym.transfer.decode_room import landed_rows
from sglang_asym.transfer.extents import LANDING_POOL
from sglang_asym.transfer.engine import MooncakeEngine
from sglang_asym.transfer.errors import EngineError, UnregisteredMemoryError
from support.loopback_common import (GroupSpec, churned_allocator, make_pools, manifest_from,
                                                  pattern_rows, wait_for)
from sglang_asym.transfer.prefill_manager import PrefillTransferManager
from sglang_asym.transfer.staging import copy_mode, scatter_rows


def _copy_runs() -> dict:
    try:
        from sgl_kernel_ext.copy import RUNS
    except ImportError:  # the package is optional for the numpy path
        RUNS = {}
    return {"copy_mode": copy_mode(), "kernel_runs": dict(RUNS)}


class PrefillAgent:
    def __init__(self, config: TransferConfig, compat: TransferCompat, capacities: dict[str, int],
                 churn_block: int = 37, seed: int = 1):
        self.engine = MooncakeEngine(config.host, config.write_timeout_s)
        self.server = BootstrapServer(config.host, 0)
        self.pools = make_pools(compat, capacities)
        self.allocators = {n: churned_allocator(n, c, churn_block, seed) for n, c in capacities.items()}
        self.manager = PrefillTransferManager(config, compat, self.engine, self.pools, self.server.address)
        self.senders, self.source = {}, {}
        self._writes: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # every write's entries, in order
        self._writes_from: dict[int, int] = {}                                # room -> its first write there
        start_write = self.engine.start_write

        def recording_start_write(session, src, dst, lengths, *args, **kwargs):
            if not self._bare:
                self._writes.append((src.copy(), dst.copy(), lengths.copy()))
            return start_write(session, src, dst, lengths, *args, **kwargs)

        self._bare = False  # bare_write running: its writes are not the layer's

        self.engine.start_write = recording_start_write

    def info(self) -> dict:
        return {"pid": os.getpid(), "bootstrap_port": self.server.port, "session": self.engine.session_id,
                "control_endpoint": self.manager.channel.endpoint}

    def start_sender(self, room: int, groups: list[GroupSpec], seed: int, scatter: bool = False
                     ) -> dict[str, list[int]]:
        """`scatter` permutes the source slots so no two rows are adjacent (one entry per row)."""
        manifest = manifest_from(groups)
        slots = {g.name: self.allocators[g.name].allocate(g.num_rows) for g in manifest.groups}
        if scatter:
            slots = {n: np.random.default_rng(seed).permutation(s) for n, s in slots.items()}
        for g in manifest.groups:
            self.pools[g.name].array[slots[g.name]] = pattern_rows(seed, g.name, g.num_rows, g.row_bytes)
        try:
            self.senders[room] = self.manager.create_sender(room, manifest, slots)
        except Exception:
            for name, s in slots.items():
                self.allocators[name].free(s)
            raise
        self.source[room] = slots
        self._writes_from[room] = len(self._writes)
        return {n: s.tolist() for n, s in slots.items()}

    def send_rows(self, room: int, group: str, start: int, end: int) -> None:
        self.senders[room].send_rows(group, start, end)

    def send_pipelined(self, room: int, chunk_rows: int, finish: bool = True) -> list[tuple[str, int, int]]:
        """Send every group in chunks, round-robin over groups (like prefill chunks would)."""
        sender, chunks = self.senders[room], []
        todo = {g.name: (sender.next_row(g.name), g.num_rows) for g in sender.manifest.groups}
        while any(s < n for s, n in todo.values()):
            for name, (s, n) in todo.items():
                if s < n:
                    e = min(n, s + chunk_rows)
                    sender.send_rows(name, s, e)
                    chunks.append((name, s, e))
                    todo[name] = (e, n)
        if finish:
            sender.finish()
        return chunks

    def finish(self, room: int) -> None:
        self.senders[room].finish()

    def staged(self, room: int) -> bool:
        return self.senders[room].staged

    def abort(self, room: int, reason: str = "aborted by prefill") -> None:
        self.senders[room].abort(reason)

    def wait(self, room: int, states: list[int], timeout_s: float = 10.0) -> tuple[int, str, float]:
        return wait_for(self.senders[room], states, timeout_s)

    def rows_written(self, room: int) -> dict[str, int]:
        return {g.name: self.senders[room].rows_written(g.name) for g in self.senders[room].manifest.groups}

    def release(self, room: int) -> None:
        if not self.senders[room].poll().is_terminal:
            raise RuntimeError(f"bootstrap_room={room} is not terminal yet")
        for name, s in self.source.pop(room).items():
            self.allocators[name].free(s)
        del self.senders[room]
        self._writes_from.pop(room)
        if not self._writes_from:  # no room left whose writes bare_write could ask for
            self._writes.clear()

    def stats(self) -> dict:
        s, staging = self.engine.stats, self.manager.staging
        return {"batches": s.batches, "entries": s.entries, "bytes": s.bytes, "failed_batches": s.failed_batches,
                "largest_batch": s.largest_batch, "malformed_messages": self.manager.channel.malformed_messages,
                "active_rooms": self.manager.active_rooms(),
                "free": {n: a.num_free for n, a in self.allocators.items()},
                "staging_free": None if staging is None else staging.allocator.num_free == staging.allocator.capacity}

    def wait_idle(self, timeout_s: float = 10.0) -> int:
        deadline = time.monotonic() + timeout_s
        while self.manager.active_rooms() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.manager.active_rooms()

    def write_from_unregistered(self, session: str, dst_ptr: int) -> str:
        """Try to write from a buffer never registered with the engine; returns the refusal."""
        buffer = np.zeros(4096, dtype=np.uint8)
        try:
            self.engine.write(session, np.array([buffer.ctypes.data], dtype=np.uint64),
                              np.array([dst_ptr], dtype=np.uint64), np.array([4096], dtype=np.uint64), 16)
        except UnregisteredMemoryError as exc:
            return str(exc)
        return "written"

    def second_engine(self) -> str:
        try:
            MooncakeEngine(self.manager.config.host)
        except EngineError as exc:
            return str(exc)
        return "created"

    def transfer_phase_start(self, room: int) -> float:
        """time.monotonic() when P first held every row and D's destinations (PrefillRoom.transfer_phase_start)."""
        start = self.senders[room]._room.transfer_phase_start
        if start == 0.0:
            raise RuntimeError(f"bootstrap_room={room} is not finished and bound yet")
        return start

    def bare_write(self, room: int, repeats: int = 1, engine_call: str = "batch_sync") -> float:
        """Seconds for a bare engine write of exactly the entries the layer wrote for room `room`, to
        the same addresses (the room must be done and its D side not released yet): a direct room's
        rows from P's pool slots to D's, a staged room's pieces from the staging to the landing extent.
        engine_call "batch_sync" is Mooncake's batch_transfer_sync_write per <= max_batch_entries
        entries, "polled" the engine wrapper's write (the calls the transfer layer makes)."""
        src, dst, lens = self.written_entries(room)
        write = {"batch_sync": self.engine.write_batch_sync, "polled": self.engine.write}[engine_call]
        session = self.senders[room]._room.request.decode_session
        self._bare = True
        try:
            start = time.perf_counter()
            for _ in range(repeats):
                write(session, src, dst, lens, self.manager.config.max_batch_entries)
            return (time.perf_counter() - start) / repeats
        finally:
            self._bare = False

    def written_entries(self, room: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The (src, dst, length) entries of every write since the room's sender was created (rooms
        moved one at a time: another room's writes meanwhile would count too)."""
        writes = self._writes[self._writes_from[room]:]
        return tuple(np.concatenate([w[i] for w in writes] or [np.zeros(0, dtype=np.uint64)]) for i in range(3))

    def entry_count(self, room: int) -> int:
        return len(self.written_entries(room)[2])

    def copy_runs(self) -> dict:
        """The staging copy mode of this process and the sgl_kernel_ext plans it ran, per backend."""
        return _copy_runs()

    def close(self) -> None:
        self.manager.close()
        self.server.close()
        self.engine.close()


class DecodeAgent:
    """`extra` adds more decode managers on the same engine (name -> (compat, capacities)), to talk
    to P with other settings or to offer the same room twice; methods pick one by `manager`."""

    def __init__(self, config: TransferConfig, compat: TransferCompat, capacities: dict[str, int],
                 churn_block: int = 23, seed: int = 2,
                 extra: dict[str, tuple[TransferCompat, dict[str, int]]] | None = None):
        self.engine = MooncakeEngine(config.host, config.write_timeout_s)
        self.pools = {"main": make_pools(compat, capacities)}
        allocators = {n: churned_allocator(n, c, churn_block, seed) for n, c in capacities.items()}
        self.managers = {"main": DecodeTransferManager(config, compat, self.engine, self.pools["main"], allocators)}
        for name, (other_compat, other_caps) in (extra or {}).items():
            self.pools[name] = make_pools(other_compat, other_caps)
            self.managers[name] = DecodeTransferManager(config, other_compat, self.engine, self.pools[name])
        self.receivers, self.snapshots = {}, {}

    def info(self) -> dict:
        return {"pid": os.getpid(), "session": self.engine.session_id}

    def seconds_to_outcome(self, room: int, timeout_s: float = 30.0) -> tuple[int, float, float]:
        """Wait for the room; (state, seconds from create_receiver to the terminal state, time.monotonic()
        of that state) from the manager's own timestamps, so how often this loop polls does not change
        the numbers, only the CPU it takes."""
        rx = self.receivers[(room, "main")]
        state, _, _ = wait_for(rx, [0, 4], timeout_s, interval_s=0.002)
        return state, rx.seconds_to_outcome, rx.finished_at

    def start_receiver(self, room: int, groups: list[GroupSpec], bootstrap_port: int, manager: str = "main",
                       host: str = "127.0.0.1", snapshot: bool = False, return_slots: bool = True
                       ) -> dict[str, list[int]] | None:
        """`return_slots=False` skips listing the slots, which would compete with the transfer it times."""
        if snapshot:  # every pool, and the landing buffer: what a transfer must leave alone
            landing = self.managers[manager].landing
            self.snapshots[room] = {n: p.array.copy() for n, p in self.pools[manager].items()}
            if landing is not None:
                self.snapshots[room][LANDING_POOL] = landing.pool.array.copy()
        rx = self.managers[manager].create_receiver(host, bootstrap_port, room, manifest_from(groups))
        self.receivers[(room, manager)] = rx
        return {n: s.tolist() for n, s in rx.dest_slots.items()} if return_slots else None

    def wait(self, room: int, states: list[int], timeout_s: float = 10.0, manager: str = "main"
             ) -> tuple[int, str, float]:
        return wait_for(self.receivers[(room, manager)], states, timeout_s)

    def verify(self, room: int, seed: int) -> dict:
        """Compare the room's rows with the pattern, and (with a snapshot) every other row with its old bytes."""
        rx = self.receivers[(room, "main")]
        bad = [g.name for g in rx.manifest.groups
               if not np.array_equal(rx.rows(g.name), pattern_rows(seed, g.name, g.num_rows, g.row_bytes))]
        untouched = None
        if room in self.snapshots:
            untouched = True
            landing = self.managers["main"].landing
            pools = {**self.pools["main"], **({LANDING_POOL: landing.pool} if landing is not None else {})}
            owned = rx._room.owned_slots()
            for name, before in self.snapshots.pop(room).items():
                mask = np.ones(len(before), dtype=bool)
                mask[owned.get(name, [])] = False
                untouched &= bool(np.array_equal(pools[name].array[mask], before[mask]))
        return {"mismatched_groups": bad, "untouched_ok": untouched,
                "bytes_checked": int(sum(g.nbytes for g in rx.manifest.groups))}

    def scatter_landed(self, room: int, seed: int) -> dict:
        """Copy a staged room's landed rows into free slots of the decode pools through the staging
        copy path ($SGLANG_ASYM_STAGING_COPY), check every byte there against the pattern and that no
        other slot changed, then free the slots."""
        rx = self.receivers[(room, "main")]
        if not rx.staged:
            raise RuntimeError(f"bootstrap_room={room} did not land in the landing buffer")
        allocators = self.managers["main"].slots.allocators
        bad, untouched, checked = [], True, 0
        for g in rx.manifest.groups:
            pool = self.pools["main"][g.name]
            slots = allocators[g.name].allocate(g.num_rows)
            try:
                before = pool.array.copy()
                scatter_rows(rx.rows(g.name), pool.tensor, slots, name=g.name)
                if not np.array_equal(pool.array[slots], pattern_rows(seed, g.name, g.num_rows, g.row_bytes)):
                    bad.append(g.name)
                mask = np.ones(pool.num_slots, dtype=bool)
                mask[slots] = False
                untouched &= bool(np.array_equal(pool.array[mask], before[mask]))
                checked += g.nbytes
            finally:
                allocators[g.name].free(slots)
        return {"mismatched_groups": bad, "untouched_ok": untouched, "bytes_checked": checked, **_copy_runs()}

    def corrupt(self, room: int, group: str, row: int) -> None:
        """Flip the bytes of one row where P wrote it (a stray write on D)."""
        rx = self.receivers[(room, "main")]
        if rx.staged:
            room_state = rx._room
            landed_rows(room_state, self.managers["main"].landing, group)[row] ^= 0xFF
        else:
            self.pools["main"][group].array[rx.dest_slots[group][row]] ^= 0xFF

    def abort(self, room: int, reason: str = "aborted by decode", manager: str = "main") -> None:
        self.receivers[(room, manager)].abort(reason)

    def release(self, room: int, manager: str = "main") -> None:
        self.receivers.pop((room, manager)).release()

    def slots(self, manager: str = "main") -> dict:
        self.managers[manager].check_no_leaks()
        return self.managers[manager].slot_report()

    def wait_slots_free(self, timeout_s: float = 10.0) -> dict:
        """Wait until every pool of every manager is entirely free; returns the last reports."""
        deadline = time.monotonic() + timeout_s
        while True:
            reports = {name: self.slots(name) for name in self.managers}
            done = all(r["free"] == r["capacity"] for rep in reports.values() for r in rep.values())
            if done or time.monotonic() > deadline:
                return {"all_free": done, "reports": reports}
            time.sleep(0.01)

    def active_rooms(self) -> int:
        return sum(m.active_rooms() for m in self.managers.values())

    def _pool(self, group: str):
        return self.managers["main"].landing.pool if group == LANDING_POOL else self.pools["main"][group]

    def unregister(self, group: str) -> None:
        """Take a pool (or the landing buffer, LANDING_POOL) away from the engine: writes to it fail."""
        self.engine.unregister(self._pool(group).base_ptr)

    def register(self, group: str) -> None:
        pool = self._pool(group)
        self.engine.register(pool.base_ptr, pool.nbytes)

    def staged(self, room: int, manager: str = "main") -> bool:
        """Whether the room landed in the landing buffer (else in pool slots)."""
        return self.receivers[(room, manager)].staged

    def close(self) -> None:
        for m in self.managers.values():
            m.close()
        self.engine.close()
