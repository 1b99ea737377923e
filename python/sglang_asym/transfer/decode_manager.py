"""Decode side: one DecodeTransferManager per worker process, one Receiver per request.

The manager owns the destination pools (registered once) and their slot allocators. For a
request it allocates slots, finds P through the bootstrap server (once per P: afterwards the
handshake leaves from create_receiver itself), sends the handshake with the slot runs, and
after P's TransferComplete re-computes the CRC of its destination rows before it reports
Success. Rows of a failed room that P might still write are quarantined. With a landing buffer
(config.landing_bytes) a room that fits gets one landing extent instead of pool slots
(extents.py says why); the receiver then reads its rows there.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

import numpy as np

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer import bootstrap_client, codec
from sglang_asym.transfer.channel import Channel, PeerUnreachableError
from sglang_asym.transfer.compat import TransferCompat
from sglang_asym.transfer.config import TransferConfig, stall_threshold
from sglang_asym.transfer.decode_room import DecodeRoom, destinations, landed_rows
from sglang_asym.transfer.decode_verifier import CompletionVerifier
from sglang_asym.transfer.engine import MooncakeEngine
from sglang_asym.transfer.errors import DuplicateRoomError
from sglang_asym.transfer.extents import LANDING_POOL, ExtentBuffer
from sglang_asym.transfer.loops import ServiceLoop, TaskWorker
from sglang_asym.transfer.messages import (DecodeAbort, Ping, Pong, PrefillFailed, TransferAccept,
                                           TransferComplete, TransferReject, TransferRequest,
                                           TransferVerdict, check_room)
from sglang_asym.transfer.poll import KVPoll
from sglang_asym.transfer.row_pool import RowPool
from sglang_asym.transfer.slots import DecodeSlots, SlotAllocator

logger = logging.getLogger(__name__)


class DecodeTransferManager:
    def __init__(self, config: TransferConfig, compat: TransferCompat, engine: MooncakeEngine,
                 pools: Mapping[str, RowPool], allocators: Mapping[str, SlotAllocator] | None = None):
        self.config, self.compat, self.engine = config, compat, engine
        self.pools = dict(pools)
        for name, pool in self.pools.items():
            if compat.row_format(name).row_bytes != pool.row_bytes:
                raise ValueError(f"pool {name!r} has {pool.row_bytes} B rows, its row format says "
                                 f"{compat.row_format(name).row_bytes} B")
        allocators = dict(allocators) if allocators is not None else {
            n: SlotAllocator(n, p.num_slots) for n, p in self.pools.items()}
        for name, pool in self.pools.items():
            if name not in allocators or allocators[name].capacity != pool.num_slots:
                raise ValueError(f"pool {name!r} needs an allocator over its {pool.num_slots} slots")
        self.landing = ExtentBuffer(LANDING_POOL, config.landing_bytes) if config.landing_bytes else None
        if self.landing is not None:
            if LANDING_POOL in self.pools:
                raise ValueError(f"pool name {LANDING_POOL!r} is reserved for the landing buffer")
            allocators[LANDING_POOL] = self.landing.allocator
        self.slots = DecodeSlots(allocators)
        codec.remember(compat)  # P's accepts carry its compat, normally equal to ours: one lookup
        self._registered = list(self.pools.values()) + ([self.landing.pool] if self.landing else [])
        for pool in self._registered:
            engine.register(pool.base_ptr, pool.nbytes)
        self._lock = threading.RLock()
        self._rooms: dict[int, DecodeRoom] = {}
        self._endpoints: dict[str, str] = {}         # bootstrap addr -> P control endpoint
        self._last_ping: dict[str, float] = {}
        self._unanswered_since: dict[str, float] = {}  # P endpoint -> first ping not answered yet
        self._last_tick = time.monotonic()
        self.channel = Channel(config.host)
        self._worker = TaskWorker("decode-transfer-worker")
        self._checksums = ThreadPoolExecutor(config.checksum_threads, thread_name_prefix="decode-crc")
        self._verifier = CompletionVerifier(self.pools, self._checksums, self._conclude, self.landing)
        self._loop = ServiceLoop("decode-transfer-service", self.channel, self._on_message, self._on_tick,
                                 config.tick_s)

    # ---- called through Receiver ------------------------------------------------------
    def create_receiver(self, bootstrap_host: str, bootstrap_port: int, bootstrap_room: int,
                        manifest: PayloadManifest) -> Receiver:
        check_room(bootstrap_room)
        self.compat.check_manifest(manifest)
        with self._lock:
            if bootstrap_room in self._rooms or bootstrap_room in self.slots.quarantine:
                raise DuplicateRoomError(f"bootstrap_room={bootstrap_room} is already active on this decode worker")
            landing = self.landing.reserve(manifest.total_bytes) if self.landing is not None else None
            room = DecodeRoom(bootstrap_room, f"{bootstrap_host}:{bootstrap_port}", manifest,
                              self.slots.allocate(manifest) if landing is None else {},
                              created_at=time.monotonic(), landing=landing)
            self._rooms[bootstrap_room] = room
            endpoint = self._endpoints.get(room.bootstrap_addr)
            if endpoint is not None:  # a prefill we already know: no lookup, no hop through the worker
                self._send_handshake(room, endpoint)
        if endpoint is None:
            self._worker.submit(self._connect, room)
        return Receiver(self, room)

    def abort(self, room: DecodeRoom, reason: str) -> None:
        with self._lock:
            self._fail(room, reason, writes_may_land=True)

    def release(self, room: DecodeRoom) -> None:
        self.slots.take_back(room.room)

    def rows(self, room: DecodeRoom, group: str) -> np.ndarray:
        """A Success room's rows of one group, (num_rows, row_bytes): a view of its landing extent
        (valid until release()) or a copy out of its pool slots."""
        if room.state != KVPoll.Success:
            raise RuntimeError(f"bootstrap_room={room.room} has no rows: its transfer is {room.state.name}")
        if room.landing is not None:
            assert self.landing is not None
            return landed_rows(room, self.landing, group)
        return self.pools[group].array[room.dest_slots[group]]

    # ---- worker tasks -----------------------------------------------------------------
    def _resolve(self, addr: str) -> str:
        if addr in self._endpoints:
            return self._endpoints[addr]
        timeout = self.config.http_timeout_s
        info = bootstrap_client.fetch_server_info(addr, timeout)
        if info.get("page_size") is not None and info["page_size"] != self.compat.page_size:
            raise ValueError(f"page size mismatch: prefill at {addr} has page_size={info['page_size']}, "
                             f"decode has {self.compat.page_size}")
        if info["dp_size"] != 1 or info["attn_tp_size"] != 1 or info["attn_cp_size"] != 1 or info["pp_size"] != 1:
            raise ValueError(f"prefill at {addr} is sharded (dp/tp/cp/pp = {info['dp_size']}/{info['attn_tp_size']}/"
                             f"{info['attn_cp_size']}/{info['pp_size']}); only one rank is supported")
        ip, port = bootstrap_client.fetch_rank(addr, 0, 0, 0, 0, timeout)
        self._endpoints[addr] = endpoint = f"tcp://{ip}:{port}"
        return endpoint

    def _connect(self, room: DecodeRoom) -> None:
        try:
            endpoint = self._resolve(room.bootstrap_addr)
        except (bootstrap_client.BootstrapError, ValueError, KeyError) as exc:
            with self._lock:
                self._fail(room, f"cannot bootstrap with prefill at {room.bootstrap_addr}: {exc}",
                           writes_may_land=False)
            return
        with self._lock:
            if not room.state.is_terminal:
                self._send_handshake(room, endpoint)

    def _send_handshake(self, room: DecodeRoom, endpoint: str) -> None:
        """Caller holds the lock."""
        logger.debug("bootstrap_room=%d: connecting to prefill at %s", room.room, endpoint)
        landing = self.landing.address(room.landing) if room.landing is not None else None
        req = TransferRequest(room.room, self.channel.endpoint, self.engine.session_id, self.compat,
                              room.manifest, destinations(room, self.pools), landing)
        room.peer, room.handshake_sent = endpoint, True
        try:
            self.channel.send(endpoint, req)
        except PeerUnreachableError as exc:
            self._fail(room, f"cannot reach prefill at {endpoint}: {exc}", writes_may_land=False)

    def _conclude(self, room: DecodeRoom, msg: TransferComplete, problem: str | None) -> None:
        """The verifier's verdict on P's completion (service thread or a CRC thread)."""
        logger.debug("bootstrap_room=%d: verified %d rows: %s", room.room, room.manifest.total_rows, problem or "ok")
        with self._lock:
            if room.state.is_terminal:
                return
            if problem is None:
                room.state, room.finished_at = KVPoll.Success, time.monotonic()
                del self._rooms[room.room]
                self.slots.hand_over(room.room, room.owned_slots())
            else:  # P sends the completion after its last write returned: nothing is in flight
                self._fail(room, problem, writes_may_land=False)
        self.channel.try_send(room.peer, TransferVerdict(room.room, problem is None, problem or ""))

    # ---- failures -----------------------------------------------------------------------
    def _fail(self, room: DecodeRoom, reason: str, writes_may_land: bool, tell_prefill: bool = True) -> None:
        """Caller holds the lock. Frees the room's slots, or quarantines them while P might still write."""
        if room.state.is_terminal:
            return
        room.state, room.reason, room.finished_at = KVPoll.Failed, reason, time.monotonic()
        del self._rooms[room.room]
        logger.info("decode bootstrap_room=%d failed: %s", room.room, reason)
        if room.handshake_sent and writes_may_land:
            self.slots.hold(room.room, room.owned_slots(), time.monotonic() + self.config.quarantine_grace_s)
            if tell_prefill:
                self.channel.try_send(room.peer, DecodeAbort(room.room, reason, self.channel.endpoint))
        else:
            self.slots.free(room.owned_slots())

    # ---- control messages (service thread) ---------------------------------------------
    def _on_message(self, msg) -> None:
        logger.debug("decode got %s (room %s)", type(msg).__name__, getattr(msg, "room", "-"))
        if isinstance(msg, Pong):
            self._heard(msg.prefill_endpoint)
            return
        if isinstance(msg, PrefillFailed) and msg.writes_stopped and self.slots.release_quarantine(msg.room):
            return  # a failed room's rows are safe to reuse now
        with self._lock:
            room = self._rooms.get(getattr(msg, "room", None))
            if room is None:
                return  # late message for a room that already ended
            self._heard(room.peer)
            if isinstance(msg, TransferAccept):
                problem = self.compat.mismatch(msg.compat)
                if problem is not None:
                    self._fail(room, f"incompatible prefill worker (decode vs prefill): {problem}", True)
                elif room.state == KVPoll.Bootstrapping:
                    room.state, room.accepted_at = KVPoll.WaitingForInput, time.monotonic()
            elif isinstance(msg, TransferReject):  # P never writes to a room it rejected
                self._fail(room, f"prefill refused the transfer: {msg.reason}", writes_may_land=False)
            elif isinstance(msg, PrefillFailed):
                self._fail(room, f"prefill failed: {msg.reason}", writes_may_land=not msg.writes_stopped,
                           tell_prefill=False)
            elif isinstance(msg, TransferComplete) and not room.verifying:
                logger.debug("bootstrap_room=%d: completion received", room.room)
                room.verifying, room.state = True, KVPoll.Transferring
                self._verifier.start(room, msg)

    def _heard(self, endpoint: str | None) -> None:
        self._unanswered_since.pop(endpoint, None)

    # ---- deadlines, liveness, quarantine (service thread) -------------------------------
    def _on_tick(self, now: float) -> None:
        cfg = self.config
        self.slots.expire(now)
        with self._lock:
            if now - self._last_tick > stall_threshold(cfg):  # we were stalled, not the peers
                self._unanswered_since.clear()
            self._last_tick = now
            peers: dict[str, list[DecodeRoom]] = {}
            for room in list(self._rooms.values()):
                if room.verifying:
                    continue
                if room.state == KVPoll.Bootstrapping and now - room.created_at > cfg.bootstrap_timeout_s:
                    self._fail(room, f"prefill did not accept within {cfg.bootstrap_timeout_s:g}s", True)
                    # A P restarted on its bootstrap port listens on a new control endpoint: look it up
                    # again for the next room instead of handshaking with the old one forever.
                    if self._endpoints.get(room.bootstrap_addr) == room.peer:
                        del self._endpoints[room.bootstrap_addr]
                elif room.state == KVPoll.WaitingForInput and now - room.accepted_at > cfg.waiting_timeout_s:
                    self._fail(room, f"no completion within {cfg.waiting_timeout_s:g}s of the handshake", True)
                elif room.handshake_sent:
                    peers.setdefault(room.peer, []).append(room)
            for peer, rooms in peers.items():
                since = self._unanswered_since.get(peer)
                if since is not None and now - since > cfg.peer_timeout_s:
                    self._endpoints = {a: e for a, e in self._endpoints.items() if e != peer}
                    for room in rooms:
                        self._fail(room, f"prefill peer {peer} silent for {now - since:.1f}s (dead or frozen)", True)
                    self._unanswered_since.pop(peer, None)
                elif now - self._last_ping.get(peer, 0.0) >= cfg.heartbeat_interval_s:
                    self._last_ping[peer] = now
                    self._unanswered_since.setdefault(peer, now)
                    self.channel.try_send(peer, Ping(self.channel.endpoint))

    # ---- introspection ------------------------------------------------------------------
    def slot_report(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return self.slots.report([r.owned_slots() for r in self._rooms.values()])

    def check_no_leaks(self) -> None:
        with self._lock:
            self.slots.check_no_leaks([r.owned_slots() for r in self._rooms.values()])

    def active_rooms(self) -> int:
        with self._lock:
            return len(self._rooms)

    def landing_extents_in_use(self) -> int:
        """Landing extents held by open rooms, quarantined after a failure, or handed over and not released."""
        with self._lock:
            return self.slots.holders(LANDING_POOL, [r.owned_slots() for r in self._rooms.values()])

    def close(self) -> None:
        self._loop.stop()
        self._worker.stop()
        self._checksums.shutdown()
        self.channel.close()
        for pool in self._registered:
            self.engine.unregister(pool.base_ptr)


class Receiver:
    """Per-request handle on the decode side (what SGLang calls a KVReceiver).

        receiver = manager.create_receiver(bootstrap_host, bootstrap_port, room, manifest)
        while receiver.poll() not in (KVPoll.Success, KVPoll.Failed): ...
        on Success: receiver.rows(group) has the rows (a staged room's live in its landing extent, a
                    direct room's in receiver.dest_slots: row i of a group in its i-th slot);
                    the caller owns them until receiver.release().
        on Failed:  the manager already freed (or quarantined) the slots; release() is a no-op.
    """

    def __init__(self, manager: DecodeTransferManager, room: DecodeRoom):
        self._manager = manager
        self._room = room

    @property
    def bootstrap_room(self) -> int:
        return self._room.room

    @property
    def manifest(self) -> PayloadManifest:
        return self._room.manifest

    @property
    def dest_slots(self) -> dict[str, np.ndarray]:
        """The pool slots of a direct room (empty for a staged one)."""
        return self._room.dest_slots

    @property
    def staged(self) -> bool:
        return self._room.landing is not None

    def rows(self, group: str) -> np.ndarray:
        """The group's rows after Success, (num_rows, row_bytes); valid until release()."""
        return self._manager.rows(self._room, group)

    def poll(self) -> KVPoll:
        return self._room.state

    @property
    def failure_reason(self) -> str:
        return self._room.reason

    @property
    def seconds_to_outcome(self) -> float | None:
        """Seconds from create_receiver to Success/Failed (None while in flight)."""
        r = self._room
        return r.finished_at - r.created_at if r.state.is_terminal else None

    @property
    def finished_at(self) -> float | None:
        """time.monotonic() when the room became Success/Failed (None while in flight)."""
        return self._room.finished_at if self._room.state.is_terminal else None

    def abort(self, reason: str = "aborted by decode") -> None:
        self._manager.abort(self._room, reason)

    def release(self) -> None:
        """Give the rows of a Success room back to the pool (the request is done with them)."""
        self._manager.release(self._room)
