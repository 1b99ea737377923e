"""Prefill side: one PrefillTransferManager per worker process, one Sender per request.

The manager registers its source pools with the engine once, registers its control
endpoint with the bootstrap server, answers D's handshakes, and writes rows with Mooncake
on its TaskWorker (FIFO, so a room's writes precede its TransferComplete). A room is
Success only after D re-checked the rows and sent a positive verdict.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Mapping, Sequence

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer import bootstrap_client, codec
from sglang_asym.transfer.channel import Channel
from sglang_asym.transfer.compat import TransferCompat
from sglang_asym.transfer.config import TransferConfig, stall_threshold
from sglang_asym.transfer.engine import MooncakeEngine
from sglang_asym.transfer.errors import DuplicateRoomError
from sglang_asym.transfer.extents import STAGING_POOL, ExtentBuffer
from sglang_asym.transfer.loops import ServiceLoop
from sglang_asym.transfer.messages import (DecodeAbort, Ping, Pong, PrefillFailed, TransferAccept,
                                           TransferReject, TransferRequest, TransferVerdict, check_room)
from sglang_asym.transfer.poll import KVPoll
from sglang_asym.transfer.prefill_room import PrefillRoom, SourceRows, check_request, check_source_slots
from sglang_asym.transfer.prefill_writer import PrefillWriter
from sglang_asym.transfer.row_pool import RowPool
from sglang_asym.transfer.staging import StagingExtent

logger = logging.getLogger(__name__)


class PrefillTransferManager:
    """`bootstrap_addr` ("host:port" of the bootstrap server) gets this worker's rank registered
    with SGLang's PUT /route body; `kv_cache_dtype` and `kv_layout` go into that body as is
    (SGLang's decode side compares them with its own)."""

    def __init__(self, config: TransferConfig, compat: TransferCompat, engine: MooncakeEngine,
                 pools: Mapping[str, RowPool], bootstrap_addr: str | None = None, kv_cache_dtype: str = "auto",
                 kv_layout: str | None = None):
        self.config, self.compat, self.engine = config, compat, engine
        self.pools = dict(pools)
        for name, pool in self.pools.items():
            if compat.row_format(name).row_bytes != pool.row_bytes:
                raise ValueError(f"pool {name!r} has {pool.row_bytes} B rows, its row format says "
                                 f"{compat.row_format(name).row_bytes} B")
        codec.remember(compat)  # D's handshakes carry it back: decoded by one lookup
        self._lock = threading.RLock()
        self._rooms: dict[int, PrefillRoom] = {}
        self._finished: dict[int, tuple[str, float]] = {}          # room -> (outcome, when)
        self._pending: dict[int, tuple[TransferRequest, float, float]] = {}  # before create_sender: (req, now, arrived)
        self._early_rejections: dict[int, tuple[str, float]] = {}
        self._last_heard: dict[str, float] = {}                    # decode endpoint -> time
        self._last_tick = time.monotonic()
        self.channel = Channel(config.host)
        self.staging = ExtentBuffer(STAGING_POOL, config.staging_bytes) if config.staging_bytes else None
        self._registered = list(self.pools.values()) + ([self.staging.pool] if self.staging else [])
        try:
            for pool in self._registered:
                engine.register(pool.base_ptr, pool.nbytes)
            if bootstrap_addr is not None:
                bootstrap_client.register_prefill_rank(bootstrap_addr, bootstrap_client.RankRegistration(
                    rank_ip=config.host, rank_port=self.channel.port, page_size=compat.page_size,
                    kv_cache_dtype=kv_cache_dtype, kv_layout=kv_layout), timeout_s=config.http_timeout_s)
        except Exception:
            self.channel.close()
            for pool in self._registered:
                if engine.regions.contains(pool.base_ptr):
                    engine.unregister(pool.base_ptr)
            raise
        self._writer = PrefillWriter(config, engine, self.pools, self.channel, self._lock, self._fail)
        self._loop = ServiceLoop("prefill-transfer-service", self.channel, self._on_message, self._on_tick,
                                 config.tick_s)

    # ---- called through Sender --------------------------------------------------------
    def create_sender(self, bootstrap_room: int, manifest: PayloadManifest,
                      source_slots: Mapping[str, Sequence[int]]) -> Sender:
        check_room(bootstrap_room)
        self.compat.check_manifest(manifest)
        slots = check_source_slots(manifest, source_slots, self.pools)
        now = time.monotonic()
        room = PrefillRoom(bootstrap_room, manifest, slots, created_at=now)
        if self.staging is not None:  # None when no extent is free: the room goes direct
            room.staging = StagingExtent.reserve(self.staging, manifest)
            room.staged = room.staging is not None
        room.source_rows = SourceRows.build(manifest, slots, self.pools, room.staging)  # off the critical path
        room.checksums = self._writer.checksums_for(room)
        codec.remember(manifest)  # so is the manifest: off the handshake's critical path from here
        with self._lock:
            if bootstrap_room in self._rooms:
                if room.staging is not None:
                    room.staging.free()
                raise DuplicateRoomError(f"bootstrap_room={bootstrap_room} is already active on this prefill worker")
            self._finished.pop(bootstrap_room, None)
            self._rooms[bootstrap_room] = room
            rejected = self._early_rejections.pop(bootstrap_room, None)
            pending = self._pending.pop(bootstrap_room, None)
            if rejected is not None:
                room.state, room.reason = KVPoll.Failed, rejected[0]
            elif pending is not None:
                self._bind(room, pending[0], now, pending[2])
        return Sender(self, room)

    def send_rows(self, room: PrefillRoom, group: str, row_start: int, row_end: int) -> None:
        with self._lock:
            if room.declare_rows(group, row_start, row_end):
                if room.staging is not None:  # under the lock: a dropped room's extent is freed under it too
                    room.staging.copy_in(self.pools[group], group, room.source_slots[group], row_start, row_end)
                room.checksums.add(group, row_start, row_end)  # summed now, while the rows wait or fly
                if room.bound:
                    room.state = KVPoll.Transferring
                    self._writer.queue_rows(room)

    def finish(self, room: PrefillRoom) -> None:
        with self._lock:
            if room.mark_finished() and room.bound:
                room.state = KVPoll.Transferring
                self._writer.queue_complete(room)

    def abort(self, room: PrefillRoom, reason: str) -> None:
        with self._lock:
            self._fail(room, reason)

    def _fail(self, room: PrefillRoom, reason: str) -> None:
        """Caller holds the lock. Terminal at once; D hears about it after the writes drained."""
        if room.state.is_terminal:
            return
        room.state, room.reason = KVPoll.Failed, reason
        logger.info("prefill bootstrap_room=%d failed: %s", room.room, reason)
        if room.bound:
            self._writer.queue_failure_notice(room)

    # ---- control messages (service thread) ---------------------------------------------
    def _on_message(self, msg) -> None:
        logger.debug("prefill got %s (room %s)", type(msg).__name__, getattr(msg, "room", "-"))
        now = time.monotonic()
        if isinstance(msg, Ping):
            self._last_heard[msg.decode_endpoint] = now
            self.channel.try_send(msg.decode_endpoint, Pong(self.channel.endpoint))
        elif isinstance(msg, TransferRequest):
            self._last_heard[msg.decode_endpoint] = now
            self._on_request(msg, now, self.channel.last_received_at)
        elif isinstance(msg, (TransferVerdict, DecodeAbort)):
            self._on_decode_outcome(msg, now)
        else:
            logger.error("prefill worker got unexpected %s", type(msg).__name__)

    def _reject(self, req: TransferRequest, reason: str) -> None:
        self.channel.try_send(req.decode_endpoint, TransferReject(req.room, reason))

    def _on_request(self, req: TransferRequest, now: float, arrived: float) -> None:
        diff = self.compat.mismatch(req.compat)
        with self._lock:
            room = self._rooms.get(req.room)
            if diff is not None:
                reason = f"incompatible decode worker (prefill vs decode): {diff}"
                self._reject(req, reason)
                if room is None:
                    self._early_rejections[req.room] = (reason, now)
                elif not room.bound:
                    self._fail(room, reason)
            elif room is None:
                if req.room in self._pending:
                    self._reject(req, f"duplicate bootstrap_room={req.room}: another decode handshake is waiting")
                elif req.room in self._finished:
                    self._reject(req, f"prefill request for bootstrap_room={req.room} already ended "
                                      f"({self._finished[req.room][0]})")
                else:
                    self._pending[req.room] = (req, now, arrived)
            elif room.bound:
                self._reject(req, f"duplicate bootstrap_room={req.room}: already bound to decode "
                                  f"{room.request.decode_endpoint}")
            elif room.state.is_terminal:
                self._reject(req, f"prefill request already failed: {room.reason}")
            else:
                self._bind(room, req, now, arrived)

    def _bind(self, room: PrefillRoom, req: TransferRequest, now: float, arrived: float) -> None:
        """Caller holds the lock. `arrived`: when the handshake came off the socket."""
        try:
            room.dest_slots = check_request(room, req)
        except ValueError as exc:
            self._reject(req, str(exc))
            self._fail(room, f"refused decode handshake: {exc}")
            return
        room.request, room.bound_at, room.request_arrived_at = req, now, arrived
        logger.debug("bootstrap_room=%d: bound to decode %s", room.room, req.decode_endpoint)
        self._last_heard[req.decode_endpoint] = now
        room.state = KVPoll.Transferring if (room.pending_ranges or room.finished) else KVPoll.WaitingForInput
        # First, so the bytes move before the accept is encoded and sent. A small finished room is written
        # to the end here, under the lock (so nothing can queue its failure notice before the write ended
        # or went to the worker), and its completion leaves from here, before the accept.
        written = self._writer.start_rows(room)
        if written:
            self._writer.complete_now(room)
        if room.state != KVPoll.Failed:
            self.channel.try_send(req.decode_endpoint, TransferAccept(room.room, self.channel.endpoint, self.compat))
        if room.finished and not written:
            self._writer.queue_complete(room)

    def _on_decode_outcome(self, msg: TransferVerdict | DecodeAbort, now: float) -> None:
        with self._lock:
            room = self._rooms.get(msg.room)
            if room is None or not room.bound:
                if isinstance(msg, DecodeAbort):  # nothing of ours wrote or will write to it
                    if room is None:  # never bind a handshake D gave up on, even if the request comes later
                        self._pending.pop(msg.room, None)
                        self._early_rejections[msg.room] = (f"aborted by decode: {msg.reason}", now)
                    else:
                        self._fail(room, f"aborted by decode: {msg.reason}")
                    self._last_heard[msg.decode_endpoint] = now
                    self.channel.try_send(msg.decode_endpoint,
                                          PrefillFailed(msg.room, "no active prefill transfer", writes_stopped=True))
                return
            self._last_heard[room.request.decode_endpoint] = now
            if isinstance(msg, DecodeAbort):
                if room.state.is_terminal:  # already drained or draining: confirm once it is
                    self._writer.queue_failure_notice(room)
                self._fail(room, f"aborted by decode: {msg.reason}")
            elif msg.ok and room.state != KVPoll.Failed:
                room.state = KVPoll.Success
            else:
                self._fail(room, f"decode rejected the transfer: {msg.reason}")

    # ---- deadlines and liveness (service thread) ----------------------------------------
    def _on_tick(self, now: float) -> None:
        cfg = self.config
        with self._lock:
            if now - self._last_tick > stall_threshold(cfg):  # we were stalled, not the peers
                self._last_heard = {ep: now for ep in self._last_heard}
            self._last_tick = now
            for room in list(self._rooms.values()):
                if room.state.is_terminal:
                    if room.drained:
                        del self._rooms[room.room]
                        self._finished[room.room] = (room.state.name, now)
                        if room.staging is not None:  # no write of it is left: the extent can go
                            room.staging.free()
                            room.staging = None
                elif not room.bound:
                    if now - room.created_at > cfg.bootstrap_timeout_s:
                        self._fail(room, f"no decode handshake within {cfg.bootstrap_timeout_s:g}s")
                elif now - room.bound_at > cfg.waiting_timeout_s:
                    self._fail(room, f"transfer not concluded within {cfg.waiting_timeout_s:g}s of the handshake")
                else:
                    silent = now - self._last_heard.get(room.request.decode_endpoint, room.bound_at)
                    if silent > cfg.peer_timeout_s:
                        self._fail(room, f"decode peer {room.request.decode_endpoint} silent for {silent:.1f}s "
                                         f"(dead or frozen)")
            for room_id, (req, at, _) in list(self._pending.items()):
                if now - at > cfg.bootstrap_timeout_s:
                    del self._pending[room_id]
                    reason = f"prefill has no request with bootstrap_room={room_id} after {cfg.bootstrap_timeout_s:g}s"
                    self._reject(req, reason)
                    self._early_rejections[room_id] = (f"decode handshake expired: {reason}", now)
            for table in (self._early_rejections, self._finished, self._last_heard):
                for key in [k for k, v in table.items() if now - (v[1] if isinstance(v, tuple) else v)
                            > cfg.finished_room_memory_s]:
                    del table[key]

    def active_rooms(self) -> int:
        with self._lock:
            return len(self._rooms)

    def staging_extents_in_use(self) -> int:
        """Rooms holding a staging extent (freed once no write of the room is left)."""
        with self._lock:
            return sum(1 for room in self._rooms.values() if room.staging is not None)

    def close(self) -> None:
        self._loop.stop()
        self._writer.stop()
        self.channel.close()
        for pool in self._registered:
            self.engine.unregister(pool.base_ptr)


class Sender:
    """Per-request handle on the prefill side (what SGLang calls a KVSender).

    Typical use, with pipelining:
        sender = manager.create_sender(room, manifest, source_slots)
        for each prefill chunk: sender.send_rows(group, row_start, row_end)   # rows in order per group
        sender.finish()
        while sender.poll() not in (KVPoll.Success, KVPoll.Failed): ...
    Rows may be sent before D has connected; they are written once the handshake binds.
    Once poll() is terminal the transfer layer no longer needs the source rows, except that a
    Failed room may still have one write in flight on the worker for a short while (D keeps
    the destination rows quarantined, so reusing the source slots is harmless).
    """

    def __init__(self, manager: PrefillTransferManager, room: PrefillRoom):
        self._manager = manager
        self._room = room

    @property
    def bootstrap_room(self) -> int:
        return self._room.room

    @property
    def manifest(self) -> PayloadManifest:
        return self._room.manifest

    @property
    def staged(self) -> bool:
        """Whether the rows go out from a staging extent (else straight from their pool slots)."""
        return self._room.staged

    def poll(self) -> KVPoll:
        return self._room.state

    @property
    def failure_reason(self) -> str:
        return self._room.reason

    def send_rows(self, group: str, row_start: int, row_end: int) -> None:
        self._manager.send_rows(self._room, group, row_start, row_end)

    def finish(self) -> None:
        self._manager.finish(self._room)

    def send_all(self) -> None:
        """Send every row not sent yet, then finish (the non-pipelined path)."""
        for g in self._room.manifest.groups:
            self.send_rows(g.name, self.next_row(g.name), g.num_rows)
        self.finish()

    def abort(self, reason: str = "aborted by prefill") -> None:
        self._manager.abort(self._room, reason)

    def next_row(self, group: str) -> int:
        """Rows of `group` handed to send_rows so far (the next call must start here)."""
        return self._room.declared[group]

    def rows_written(self, group: str) -> int:
        """Rows of `group` the engine confirmed written to D (progress, for pipelining)."""
        return self._room.written[group]
