"""The asymmetric prefill and decode engines, joined by the Mooncake transfer layer.

Prefill (asym-prefill): the partial model computes [0, B) in chunks and ships each chunk's finished
compressed rows and index keys while it computes the next; the encoder window rows and the
compressor tails follow at the end. It answers the router's copy of the request once D has checked
every row. Decode (asym-decode): registers the room, waits for the verified payload, installs it and
hands the request to the decode loop, whose window step computes [B, N) and samples the first token.
With --transfer-fallback recompute, a request whose transfer failed gets its prefix computed on D by the
full model instead (what the colocated engine computes, so the tokens are the same).
`build()` makes the engine of any disaggregated mode (symmetric PD's engines are in symmetric.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

from ...cache.groups import ships_at_end, streams
from ...asym import PrefixState, extract_payload, run_prefix_on_full_model
from ...model import V41Model
from ...model.loading import model_from_checkpoint
from ...split import SplitPlan
from ..engine_api import FinishReason, GenerateRequest, TokenEvent
from .decode_base import DecodeEngineBase
from .decode_loop import ActiveRequest
from .options import EngineOptions, check_mode_semantics
from .payload_io import transfer_compat
from .prefill_base import PrefillEngineBase
from .streaming import stream_from_loop
from .transfer_setup import row_format_for

DISAGGREGATED_MODES = ("asym-prefill", "asym-decode", "prefill", "decode")

logger = logging.getLogger(__name__)


def _asym_compat(model: V41Model, options: EngineOptions):
    return transfer_compat(model.cfg, options.window, options.semantics.value, row_format_for(options), model.dtype)


class AsymPrefillEngine(PrefillEngineBase):
    def __init__(self, model: V41Model, options: EngineOptions, host: str = "127.0.0.1") -> None:
        if model.role != "prefill":
            raise ValueError("the asym-prefill engine runs the prefill-role model")
        super().__init__(model, options, host, "asym-prefill", _asym_compat(model, options))
        self.layers_run: tuple[int, ...] = ()

    def payload_manifest(self, req: GenerateRequest, split: SplitPlan):
        return split.manifest(self.row_format, self.model.dtype)

    def compute_and_send(self, req: GenerateRequest, split: SplitPlan, sender, slots) -> dict[str, Any]:
        """Compute [0, B) chunk by chunk; ship each group's finished rows right after each chunk."""
        manifest = sender.manifest
        meta = {"prefix_tokens": split.boundary, "prompt_tokens_computed": split.boundary, "prefill_compute_s": 0.0}
        sent = {g.name: 0 for g in manifest.groups}
        streamed = [g for g in manifest.groups if streams(g.name)]
        if not split.runs_prefill:
            sender.finish()
            meta["prefill_layers_run"] = []
            return meta
        prompt = self.prompt_tensor(req)
        cache = self.caches.new_request()
        try:
            b, chunk = split.boundary, self.options.prefill_chunk
            for a in range(0, b, chunk):
                t0 = time.perf_counter()
                self.model(prompt[a : min(a + chunk, b)], cache, logits="none")
                meta["prefill_compute_s"] += time.perf_counter() - t0
                self.layers_run = self.model.layers_run
                if not self.ship_ready(sender, cache, streamed, slots, sent):
                    return meta  # D is gone or refused: stop computing
            final = extract_payload(cache, split)
            for g in manifest.groups:
                if ships_at_end(g.name):
                    self.ship(sender, g.name, final[g.name], slots, sent)
            sender.finish()
        finally:
            cache.release()
        meta["prefill_layers_run"] = list(self.layers_run)
        return meta


class AsymDecodeEngine(DecodeEngineBase):
    def __init__(self, model: V41Model, options: EngineOptions, host: str = "127.0.0.1") -> None:
        super().__init__(model, options, host, "asym-decode", _asym_compat(model, options))
        self._before_loop: set[str] = set()  # rids receiving (or recomputing) their prefix
        self._aborted: set[str] = set()  # those of them aborted meanwhile: no fallback, no decode

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        self.require_bootstrap(req)
        split = self.split_for(req)
        prompt = self.prompt_tensor(req)
        final_meta = None
        self._before_loop.add(req.rid)
        try:
            if req.bootstrap.is_health_probe:  # SGLang's probe: no P behind it, compute the prefix here
                prefix = await self._prefix_here(prompt, split)
            else:
                rows, error = await self.receive_rows(req, split.manifest(self.row_format, self.model.dtype))
                if error is not None and self.options.transfer_fallback == "recompute" and req.rid not in self._aborted:
                    logger.warning("rid=%s bootstrap_room=%d: %s; recomputing its %d-token prefix on this decode "
                                   "worker (--transfer-fallback recompute)", req.rid, req.bootstrap.room, error,
                                   split.boundary)
                    self.metrics.count_transfer_fallback()
                    t0 = time.perf_counter()
                    prefix = await self._prefix_here(prompt, split)
                    final_meta = {"transfer_fallback": "recompute",
                                  "fallback_prefix_compute_s": time.perf_counter() - t0}
                    error = "request aborted on the decode worker" if req.rid in self._aborted else None
                if error is not None:
                    yield TokenEvent(req.rid, (), True, FinishReason.abort(error), error=error)
                    return
                if final_meta is None:
                    prefix = PrefixState(self.cfg.fingerprint(), split.window, split.semantics.value,
                                         split.prompt_len, split.boundary, rows)
        finally:
            self._before_loop.discard(req.rid)
            self._aborted.discard(req.rid)
        submit = lambda emit: self.loop.submit(ActiveRequest(req.rid, prompt, split, prefix, req.sampling, emit))  # noqa: E731
        async for event in stream_from_loop(self.loop, req.rid, submit, final_meta=final_meta):
            yield event

    async def _prefix_here(self, prompt, split: SplitPlan) -> PrefixState:
        """The prefix computed by D's full model, one at a time on the local-prefix thread and cache."""
        return await asyncio.get_running_loop().run_in_executor(
            self._probe_pool, run_prefix_on_full_model, self.model, self._probe_caches, prompt, split)

    async def abort(self, rid: str) -> None:
        if rid in self._before_loop:
            self._aborted.add(rid)
        await super().abort(rid)


def build(mode: str, model_path: str, options: EngineOptions, host: str = "127.0.0.1"):
    """The engine of a disaggregated mode, with the model role it needs loaded from the checkpoint."""
    if mode not in DISAGGREGATED_MODES:
        raise SystemExit(f"error: {mode!r} is not a disaggregated mode; choose one of {DISAGGREGATED_MODES}")
    try:
        check_mode_semantics(mode, options.semantics)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    model = model_from_checkpoint(model_path, role="prefill" if mode == "asym-prefill" else "full",
                                  cache_quant=options.cache_quant, progress=True)
    if mode == "asym-prefill":
        return AsymPrefillEngine(model, options, host)
    if mode == "asym-decode":
        return AsymDecodeEngine(model, options, host)
    from .symmetric import SymmetricDecodeEngine, SymmetricPrefillEngine

    return (SymmetricPrefillEngine if mode == "prefill" else SymmetricDecodeEngine)(model, options, host)
