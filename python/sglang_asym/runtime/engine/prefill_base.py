"""What the two prefill engines (asym-prefill and symmetric prefill) share: the request flow around
the transfer. Take transfer rows, open the room, compute and ship on the compute thread, wait until
D has checked every row, then answer the router's copy of the request (empty output, with meta:
payload bytes, prompt tokens computed, `prefill_compute_s`). Subclasses say what they ship
(`payload_manifest`) and how they compute it (`compute_and_send`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any, AsyncIterator

import numpy as np
import torch

from ...cache import CacheSizing, RequestCache
from ...manifest import PayloadManifest
from ...model import V41Model
from ...split import SplitPlan
from ...transfer import KVPoll, TransferCompat
from ...transfer.bootstrap import BootstrapServer
from ...transfer.engine import MooncakeEngine
from ...transfer.errors import DuplicateRoomError, SlotsExhaustedError
from ...transfer.prefill_manager import PrefillTransferManager
from ...transfer.slots import SlotAllocator
from ..engine_api import (BootstrapRoomInUseError, EngineOverloadedError, EngineRole, FinishReason,
                          GenerateRequest, TokenEvent)
from ..pool_accounting import TransferUsage, allocator_pools
from .base import EngineBase
from .options import EngineOptions
from .payload_io import encode_rows
from .transfer_setup import make_pools, overall_timeout_s, row_format_for, transfer_config_for, wait_terminal

logger = logging.getLogger(__name__)


class PrefillEngineBase(EngineBase):
    role = EngineRole.PREFILL

    def __init__(self, model: V41Model, options: EngineOptions, host: str, mode_name: str,
                 compat: TransferCompat) -> None:
        super().__init__(model.cfg, options, mode_name)
        self.model, self.row_format, self.compat = model, row_format_for(options), compat
        model.deterministic = options.deterministic
        self.caches = model.new_cache_set(CacheSizing(options.max_running, options.max_total_tokens, options.page_rows,
                                                      max_chunk_tokens=options.prefill_chunk))
        self.pools = make_pools(model.cfg, options, compat)
        self.allocators = {name: SlotAllocator(name, pool.num_slots) for name, pool in self.pools.items()}
        self.transfer_config = transfer_config_for(options, host)
        self._overall_timeout_s = overall_timeout_s(self.transfer_config)
        self.mooncake = MooncakeEngine(host, self.transfer_config.write_timeout_s)
        self.bootstrap = BootstrapServer(host, options.bootstrap_port or 0)
        self.manager = PrefillTransferManager(self.transfer_config, self.compat, self.mooncake, self.pools,
                                              self.bootstrap.address)
        self._compute = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefill-compute")
        self._senders: dict[str, object] = {}

    def server_info(self) -> dict[str, Any]:
        info = super().server_info()
        info["disaggregation_bootstrap_port"] = self.bootstrap.port
        return info

    # ---- what a subclass provides ---------------------------------------------------------
    def payload_manifest(self, req: GenerateRequest, split: SplitPlan) -> PayloadManifest:
        raise NotImplementedError

    def compute_and_send(self, req: GenerateRequest, split: SplitPlan, sender, slots) -> dict[str, Any]:
        """On the compute thread: compute, ship every manifest row, `sender.finish()`; returns meta for
        the answer (at least `prefill_compute_s`). Stops early once the sender has failed."""
        raise NotImplementedError

    def encode(self, group: str, rows: torch.Tensor) -> np.ndarray:
        return encode_rows(group, rows, self.row_format, self.model.cfg)

    # ---- the request flow ----------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        self.require_bootstrap(req)
        if req.bootstrap.is_health_probe:
            yield TokenEvent(req.rid, (), True, FinishReason.of_length(0))
            return
        split = self.split_for(req)
        manifest = self.payload_manifest(req, split)
        slots = self._allocate(manifest)
        try:
            sender = self.manager.create_sender(req.bootstrap.room, manifest, slots)
        except DuplicateRoomError as exc:
            self._free(slots)
            raise BootstrapRoomInUseError(str(exc)) from None
        self._senders[req.rid] = sender
        t0 = time.perf_counter()
        try:
            meta = await asyncio.get_running_loop().run_in_executor(
                self._compute, self._run_compute, req, split, sender, slots)
            state = await wait_terminal(sender, self._overall_timeout_s)
            if state == KVPoll.Success:
                self.metrics.observe_transfer(manifest.total_bytes, time.perf_counter() - t0)
                yield TokenEvent(req.rid, (), True, FinishReason.of_length(0),
                                 meta={"payload_bytes": manifest.total_bytes, **meta})
                return
            if not state.is_terminal:
                sender.abort("prefill gave up waiting for the decode worker")
            self.metrics.count_transfer_failure()
            reason = sender.failure_reason or "transfer did not complete in time"
            yield TokenEvent(req.rid, (), True, FinishReason.abort(reason), error=f"prefix transfer failed: {reason}")
        finally:
            self._senders.pop(req.rid, None)
            if not sender.poll().is_terminal:
                sender.abort("prefill request cancelled")
            self._free(slots)

    def _run_compute(self, req: GenerateRequest, split: SplitPlan, sender, slots) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            meta = self.compute_and_send(req, split, sender, slots)
        except Exception as exc:
            logger.exception("prefill of room %s failed", sender.bootstrap_room)
            sender.abort(f"prefill compute failed: {exc}")
            return {}
        meta["prefill_thread_s"] = time.perf_counter() - started
        self.observe_prefill_compute(meta["prefill_compute_s"])
        return meta

    # ---- shipping rows -------------------------------------------------------------------
    def ship(self, sender, group: str, rows: torch.Tensor, slots, sent: dict[str, int]) -> None:
        """Write rows into the group's next source slots and hand them to the transfer layer."""
        start, data = sent[group], self.encode(group, rows)
        count = data.shape[0]
        self.pools[group].array[slots[group][start : start + count]] = data
        sender.send_rows(group, start, start + count)
        sent[group] = start + count

    def ship_ready(self, sender, cache: RequestCache, groups, slots, sent: dict[str, int]) -> bool:
        """Ship the rows of `groups` (kv / index) the cache completed since the last call; False once
        the sender failed (D is gone or refused: computing on is pointless)."""
        for g in groups:
            ready = min(cache.rows(g.name).end, g.num_rows)
            if ready > sent[g.name]:
                self.ship(sender, g.name, cache.rows(g.name).read(sent[g.name], ready), slots, sent)
        return sender.poll() != KVPoll.Failed

    def _allocate(self, manifest: PayloadManifest) -> dict[str, np.ndarray]:
        """Source slots for every group or none: a shortage in one group frees what the others took (a
        partial take used to leak under load until every later request was refused)."""
        taken: dict[str, np.ndarray] = {}
        try:
            for g in manifest.groups:
                taken[g.name] = self.allocators[g.name].allocate(g.num_rows)
        except SlotsExhaustedError as exc:
            self._free(taken)
            raise EngineOverloadedError(f"prefill worker has no free transfer rows: {exc}") from None
        return taken

    def _free(self, slots) -> None:
        for name, s in slots.items():
            self.allocators[name].free(s)

    def cache_sets(self):
        return {"requests": self.caches}

    def transfer_usage(self) -> TransferUsage:
        m = self.manager
        allocators = list(self.allocators.values()) + ([m.staging.allocator] if m.staging is not None else [])
        return TransferUsage(m.active_rooms(), allocator_pools(allocators),
                             "staging" if m.staging is not None else None, m.staging_extents_in_use(),
                             len(self.mooncake.regions), self.mooncake.regions.total_bytes)

    async def abort(self, rid: str) -> None:
        sender = self._senders.get(rid)
        if sender is not None and not sender.poll().is_terminal:
            sender.abort("request aborted on the prefill worker")

    def shutdown(self) -> None:
        self.manager.close()
        self.bootstrap.close()
        self.mooncake.close()
        self._compute.shutdown(wait=False)
