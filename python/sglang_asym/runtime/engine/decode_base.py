"""What the two decode engines (asym-decode and symmetric decode) share: the full model's decode
loop, the destination pools, and receiving one request's rows (register the room, wait until the
transfer layer verified every row, decode the rows into tensors, give the slots back)."""

from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import torch

from ...cache import CacheSizing
from ...manifest import PayloadManifest
from ...model import V41Model
from ...transfer import KVPoll, TransferCompat
from ...transfer.decode_manager import DecodeTransferManager
from ...transfer.engine import MooncakeEngine
from ...transfer.errors import DuplicateRoomError, SlotsExhaustedError
from ..engine_api import BootstrapRoomInUseError, EngineOverloadedError, EngineRole, GenerateRequest
from ..metrics import QueueName
from ..pool_accounting import TransferUsage, slot_report_pools
from .base import EngineBase
from .decode_loop import DecodeLoop, load_drafter
from .options import EngineOptions
from .payload_io import decode_rows
from .transfer_setup import make_pools, overall_timeout_s, row_format_for, transfer_config_for, wait_terminal


class DecodeEngineBase(EngineBase):
    role = EngineRole.DECODE

    def __init__(self, model: V41Model, options: EngineOptions, host: str, mode_name: str,
                 compat: TransferCompat) -> None:
        super().__init__(model.cfg, options, mode_name)
        self.model, self.row_format, self.compat = model, row_format_for(options), compat
        model.deterministic = options.deterministic
        self.pools = make_pools(model.cfg, options, compat)
        self.transfer_config = transfer_config_for(options, host)
        self._overall_timeout_s = overall_timeout_s(self.transfer_config)
        self.mooncake = MooncakeEngine(host, self.transfer_config.write_timeout_s)
        self.manager = DecodeTransferManager(self.transfer_config, self.compat, self.mooncake, self.pools)
        sizing = CacheSizing(options.max_running + 1, options.max_total_tokens, options.page_rows,
                             max_chunk_tokens=options.window)
        # Health probes (no P behind them) compute their prompt here, on a scratch cache.
        self._probe_caches = model.new_cache_set(CacheSizing(1, options.max_total_tokens, options.page_rows))
        self._probe_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="probe-prefix")
        self.loop = DecodeLoop(model, model.new_cache_set(sizing), options.scheduler, model.cfg.eos_token_id,
                               on_step=self._on_step, window_chunk=options.window_chunk,
                               drafter=load_drafter(model, options.model_path, options.scheduler.num_draft_tokens),
                               graph_backend=options.graph_backend)
        self.loop.start()
        self._receivers: dict[str, object] = {}

    def _on_step(self, record) -> None:
        if record.window_rows:
            self.metrics.observe_window_step(record.seconds, record.window_rows)
        self.metrics.count_forwards(record.graphs)
        self.metrics.set_queue_size(QueueName.RUNNING, self.loop.active_requests)

    def decode(self, group: str, data: np.ndarray) -> torch.Tensor:
        return decode_rows(group, data, self.row_format, self.cfg, self.model.dtype)

    async def receive_rows(self, req: GenerateRequest, manifest: PayloadManifest
                           ) -> tuple[dict[str, torch.Tensor] | None, str | None]:
        """The request's verified rows by group, or (None, why the transfer failed)."""
        boot = req.bootstrap
        try:
            receiver = self.manager.create_receiver(boot.host, boot.port or 0, boot.room, manifest)
        except DuplicateRoomError as exc:
            raise BootstrapRoomInUseError(str(exc)) from None
        except SlotsExhaustedError as exc:
            raise EngineOverloadedError(f"decode worker has no free transfer rows: {exc}") from None
        self._receivers[req.rid] = receiver
        t0 = time.perf_counter()
        try:
            self.metrics.set_queue_size(QueueName.DECODE_TRANSFER, len(self._receivers))
            # The transfer layer bounds each phase itself: the handshake (a room P never serves) by
            # transfer_timeout_s, the transfer by its waiting timeout, a dead or frozen P by heartbeats.
            state = await wait_terminal(receiver, self._overall_timeout_s)
            if state != KVPoll.Success:
                if not state.is_terminal:
                    receiver.abort(f"prefix did not arrive within {self._overall_timeout_s} s")
                self.metrics.count_transfer_failure()
                return None, f"prefix transfer failed: {receiver.failure_reason or 'timed out'}"
            rows = {g.name: self.decode(g.name, receiver.rows(g.name)) for g in manifest.groups}
            receiver.release()
            self.metrics.observe_transfer(manifest.total_bytes, time.perf_counter() - t0)
            return rows, None
        finally:
            self._receivers.pop(req.rid, None)
            if not receiver.poll().is_terminal:
                receiver.abort("decode request cancelled")
            self.metrics.set_queue_size(QueueName.DECODE_TRANSFER, len(self._receivers))

    def cache_sets(self):
        return {"requests": self.loop.cache_set, "probe": self._probe_caches}

    def transfer_usage(self) -> TransferUsage:
        m = self.manager
        return TransferUsage(m.active_rooms(), slot_report_pools(m.slot_report()),
                             "landing" if m.landing is not None else None, m.landing_extents_in_use(),
                             len(self.mooncake.regions), self.mooncake.regions.total_bytes)

    async def abort(self, rid: str) -> None:
        receiver = self._receivers.get(rid)
        if receiver is not None and not receiver.poll().is_terminal:
            receiver.abort("request aborted on the decode worker")
        self.loop.abort(rid)

    def shutdown(self) -> None:
        self.loop.stop()
        self.manager.close()
        self.mooncake.close()
        self._probe_pool.shutdown(wait=False)
