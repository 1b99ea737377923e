"""The asymmetric prefill and decode engines, joined by the Mooncake transfer layer.

Prefill (asym-prefill): the partial model computes [0, B) in chunks and ships each chunk's finished
compressed rows and index keys while it computes the next; the encoder window rows and the
compressor tails follow at the end. It answers the router's copy of the request once D has checked
every row. Decode (asym-decode): registers the room, waits for the verified payload, installs it and
hands the request to the decode loop, whose window step computes [B, N) and samples the first token."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import AsyncIterator

import torch

from ...asym import PrefixState, extract_payload, run_prefix_on_full_model
from ...cache import CacheSizing
from ...model import V41Model
from ...model.loading import model_from_checkpoint
from ...split import SplitPlan
from ...transfer import KVPoll, RowPool, TransferConfig
from ...transfer.bootstrap import BootstrapServer
from ...transfer.decode_manager import DecodeTransferManager
from ...transfer.engine import MooncakeEngine
from ...transfer.errors import DuplicateRoomError, SlotsExhaustedError
from ...transfer.prefill_manager import PrefillTransferManager
from ...transfer.slot_pool import SlotAllocator
from ..engine_api import (BootstrapRoomInUseError, EngineOverloadedError, EngineRole, FinishReason,
                          GenerateRequest, TokenEvent)
from ..metrics import QueueName
from .base import EngineBase, EventStream
from .decode_loop import ActiveRequest, DecodeLoop
from .options import EngineOptions
from .payload_io import all_groups_plan, decode_rows, encode_rows, group_kind, transfer_compat

logger = logging.getLogger(__name__)
POLL_S = 0.002


def _row_format(options: EngineOptions) -> str:
    # Release-format packing is lossless only when the model's caches already hold quantized rows.
    return "release" if options.cache_quant == "release" else "model"


def _pools(model: V41Model, options: EngineOptions, row_format: str) -> dict[str, RowPool]:
    """One registered pool per row group, sized for max_running requests of max_total_tokens."""
    cfg = model.cfg
    manifest = all_groups_plan(cfg, options.window, options.semantics.value).manifest(row_format, model.dtype)
    pools = {}
    for g in manifest.groups:
        kind, layer = group_kind(g.name), int(g.name.split(".L")[1])
        if kind == "tail":
            rows = 1
        elif kind == "swa":
            rows = cfg.sliding_window
        else:
            rows = options.max_total_tokens // cfg.compress_ratios[layer] + 1
        pools[g.name] = RowPool.zeros(g.name, rows * options.max_running, g.row_bytes)
    return pools


async def _wait_terminal(handle, timeout_s: float) -> KVPoll:
    deadline = time.monotonic() + timeout_s
    while not handle.poll().is_terminal:
        if time.monotonic() > deadline:
            return handle.poll()
        await asyncio.sleep(POLL_S)
    return handle.poll()


class AsymPrefillEngine(EngineBase):
    role = EngineRole.PREFILL

    def __init__(self, model: V41Model, options: EngineOptions, host: str = "127.0.0.1") -> None:
        super().__init__(model.cfg, options, "asym-prefill")
        if model.role != "prefill":
            raise ValueError("the asym-prefill engine runs the prefill-role model")
        self.model, self.row_format = model, _row_format(options)
        self.caches = model.new_cache_set(CacheSizing(options.max_running, options.max_total_tokens, options.page_rows,
                                                      max_chunk_tokens=options.prefill_chunk))
        self.pools = _pools(model, options, self.row_format)
        self.allocators = {name: SlotAllocator(name, pool.num_slots) for name, pool in self.pools.items()}
        self.compat = transfer_compat(model.cfg, options.window, options.semantics.value, self.row_format, model.dtype)
        self.transfer_config = TransferConfig(host=host, bootstrap_timeout_s=options.transfer_timeout_s)
        self._overall_timeout_s = self.transfer_config.bootstrap_timeout_s + self.transfer_config.waiting_timeout_s + 5
        self.mooncake = MooncakeEngine(host, self.transfer_config.write_timeout_s)
        self.bootstrap = BootstrapServer(host, options.bootstrap_port or 0)
        self.manager = PrefillTransferManager(self.transfer_config, self.compat, self.mooncake, self.pools,
                                              self.bootstrap.address)
        self._compute = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefill-compute")
        self._senders: dict[str, object] = {}
        self.layers_run: tuple[int, ...] = ()

    def server_info(self):
        info = super().server_info()
        info["disaggregation_bootstrap_port"] = self.bootstrap.port
        return info

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        self.require_bootstrap(req)
        if req.bootstrap.is_health_probe:
            yield TokenEvent(req.rid, (), True, FinishReason.of_length(0))
            return
        split = self.split_for(req)
        manifest = split.manifest(self.row_format, self.model.dtype)
        try:
            slots = {g.name: self.allocators[g.name].allocate(g.num_rows) for g in manifest.groups}
        except SlotsExhaustedError as exc:
            raise EngineOverloadedError(f"prefill worker has no free transfer rows: {exc}") from None
        try:
            sender = self.manager.create_sender(req.bootstrap.room, manifest, slots)
        except DuplicateRoomError as exc:
            self._free(slots)
            raise BootstrapRoomInUseError(str(exc)) from None
        self._senders[req.rid] = sender
        t0 = time.perf_counter()
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._compute, self._compute_and_send, self.prompt_tensor(req), split,
                                       sender, slots)
            state = await _wait_terminal(sender, self._overall_timeout_s)
            if state == KVPoll.Success:
                self.metrics.observe_transfer(manifest.total_bytes, time.perf_counter() - t0)
                yield TokenEvent(req.rid, (), True, FinishReason.of_length(0),
                                 meta={"prefix_tokens": split.boundary, "payload_bytes": manifest.total_bytes,
                                       "prefill_layers_run": list(self.layers_run)})
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

    def _compute_and_send(self, prompt: torch.Tensor, split: SplitPlan, sender, slots) -> None:
        """Compute [0, B) chunk by chunk; ship each group's finished rows right after each chunk."""
        manifest = sender.manifest
        sent = {g.name: 0 for g in manifest.groups}
        streamed = [g for g in manifest.groups if group_kind(g.name) in ("kv", "index")]
        if not split.runs_prefill:
            sender.finish()
            return
        cache = self.caches.new_request()
        try:
            b, chunk = split.boundary, self.options.prefill_chunk
            for a in range(0, b, chunk):
                self.model(prompt[a : min(a + chunk, b)], cache, logits="none")
                self.layers_run = self.model.layers_run
                for g in streamed:
                    ready = min(cache.rows(g.name).end, g.num_rows)
                    if ready > sent[g.name]:
                        self._ship(sender, g.name, cache.rows(g.name).read(sent[g.name], ready), slots, sent)
                if sender.poll() == KVPoll.Failed:
                    return  # D is gone or refused: stop computing
            final = extract_payload(cache, split)
            for g in manifest.groups:
                if group_kind(g.name) in ("swa", "tail"):
                    self._ship(sender, g.name, final[g.name], slots, sent)
            sender.finish()
        except Exception as exc:
            logger.exception("prefill of room %s failed", sender.bootstrap_room)
            sender.abort(f"prefill compute failed: {exc}")
        finally:
            cache.release()

    def _ship(self, sender, group: str, rows: torch.Tensor, slots, sent: dict[str, int]) -> None:
        start = sent[group]
        count = 1 if group_kind(group) == "tail" else rows.shape[0]
        self.pools[group].array[slots[group][start : start + count]] = encode_rows(group, rows, self.row_format)
        sender.send_rows(group, start, start + count)
        sent[group] = start + count

    def _free(self, slots) -> None:
        for name, s in slots.items():
            self.allocators[name].free(s)

    async def abort(self, rid: str) -> None:
        sender = self._senders.get(rid)
        if sender is not None and not sender.poll().is_terminal:
            sender.abort("request aborted on the prefill worker")

    def shutdown(self) -> None:
        self.manager.close()
        self.bootstrap.close()
        self.mooncake.close()
        self._compute.shutdown(wait=False)


class AsymDecodeEngine(EngineBase):
    role = EngineRole.DECODE

    def __init__(self, model: V41Model, options: EngineOptions, host: str = "127.0.0.1") -> None:
        super().__init__(model.cfg, options, "asym-decode")
        self.model, self.row_format = model, _row_format(options)
        self.pools = _pools(model, options, self.row_format)
        self.compat = transfer_compat(model.cfg, options.window, options.semantics.value, self.row_format, model.dtype)
        self.transfer_config = TransferConfig(host=host, bootstrap_timeout_s=options.transfer_timeout_s)
        self._overall_timeout_s = self.transfer_config.bootstrap_timeout_s + self.transfer_config.waiting_timeout_s + 5
        self.mooncake = MooncakeEngine(host, self.transfer_config.write_timeout_s)
        self.manager = DecodeTransferManager(self.transfer_config, self.compat, self.mooncake, self.pools)
        sizing = CacheSizing(options.max_running + 1, options.max_total_tokens, options.page_rows,
                             max_chunk_tokens=options.window)
        self._probe_caches = model.new_cache_set(CacheSizing(1, options.max_total_tokens, options.page_rows))
        self._probe_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="probe-prefix")
        self.loop = DecodeLoop(model, model.new_cache_set(sizing), options.scheduler, model.cfg.eos_token_id,
                               on_step=self._on_step, window_chunk=options.window_chunk)
        self.loop.start()
        self._receivers: dict[str, object] = {}

    def _on_step(self, record) -> None:
        if record.window_rows:
            self.metrics.observe_window_step(record.seconds, record.window_rows)
        self.metrics.set_queue_size(QueueName.RUNNING, self.loop.active_requests)

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        self.require_bootstrap(req)
        split = self.split_for(req)
        prompt = self.prompt_tensor(req)
        if req.bootstrap.is_health_probe:  # SGLang's probe: no P behind it, compute the prefix here
            prefix = await asyncio.get_running_loop().run_in_executor(
                self._probe_pool, run_prefix_on_full_model, self.model, self._probe_caches, prompt, split)
        else:
            prefix, error = await self._receive(req, split)
            if error is not None:
                yield TokenEvent(req.rid, (), True, FinishReason.abort(error), error=error)
                return
        stream = EventStream(asyncio.get_running_loop())
        self.loop.submit(ActiveRequest(req.rid, prompt, split, prefix, req.sampling, stream.emit))
        finished = False
        try:
            async for event in stream.events():
                finished = event.finished
                yield event
        finally:
            if not finished:
                self.loop.abort(req.rid, "client went away")

    async def _receive(self, req: GenerateRequest, split: SplitPlan) -> tuple[PrefixState | None, str | None]:
        manifest = split.manifest(self.row_format, self.model.dtype)
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
            state = await _wait_terminal(receiver, self._overall_timeout_s)
            if state != KVPoll.Success:
                if not state.is_terminal:
                    receiver.abort(f"prefix did not arrive within {self._overall_timeout_s} s")
                self.metrics.count_transfer_failure()
                return None, f"prefix transfer failed: {receiver.failure_reason or 'timed out'}"
            rows = {g.name: decode_rows(g.name, self.pools[g.name].array[receiver.dest_slots[g.name]],
                                        self.row_format, self.cfg, self.model.dtype)
                    for g in manifest.groups}
            receiver.release()
            self.metrics.observe_transfer(manifest.total_bytes, time.perf_counter() - t0)
            return PrefixState(self.cfg.fingerprint(), split.window, split.semantics.value, split.prompt_len,
                               split.boundary, rows), None
        finally:
            self._receivers.pop(req.rid, None)
            if not receiver.poll().is_terminal:
                receiver.abort("decode request cancelled")
            self.metrics.set_queue_size(QueueName.DECODE_TRANSFER, len(self._receivers))

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


def build(mode: str, model_path: str, options: EngineOptions, host: str = "127.0.0.1"):
    if mode == "asym-prefill":
        return AsymPrefillEngine(model_from_checkpoint(model_path, role="prefill", cache_quant=options.cache_quant,
                                                       progress=True), options, host)
    if mode == "asym-decode":
        return AsymDecodeEngine(model_from_checkpoint(model_path, role="full", cache_quant=options.cache_quant,
                                                      progress=True), options, host)
    raise SystemExit(f"error: --disaggregation-mode {mode} (symmetric PD) is not available in the embedded runtime "
                     "yet; use asym-prefill / asym-decode, or null")
