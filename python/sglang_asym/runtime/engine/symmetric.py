"""Symmetric PD as SGLang does it today (`--disaggregation-mode prefill` / `decode`): the baseline the
asymmetric split is measured against.

Prefill: the full model runs the whole prompt [0, N) in chunks, shipping each chunk's finished
compressed rows and index keys while it computes the next, samples the first token with the
request's sampling parameters, then ships every layer's window rows, the compressor tails and the
aux rows (first token, RNG state). Decode: receives the verified state, installs it into a fresh
request cache and joins the decode loop as an already-running request whose next input is the
first token. Both compute the exact full-prompt forward, so the outputs equal a colocated server's
with `--asym-semantics exact`."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import numpy as np
import torch

from ...cache.groups import ships_at_end, streams
from ...model import V41Model
from ...split import SplitPlan
from ..engine_api import FinishReason, GenerateRequest, TokenEvent
from .decode_base import DecodeEngineBase
from .full_prefill import prefill_locally, prefill_prompt, sample_first
from .options import EngineOptions, check_mode_semantics
from .prefill_base import PrefillEngineBase
from .request_state import (AUX_GROUPS, FIRST_TOKEN, aux_rows, cache_bytes, decode_state_rows,
                            encode_state_rows, extract_state, restore_generator, state_compat, state_manifest)
from .streaming import JoinGate, join_running
from .transfer_setup import row_format_for


def _compat(model: V41Model, options: EngineOptions):
    return state_compat(model.cfg, options.window, row_format_for(options), model.dtype)


class SymmetricPrefillEngine(PrefillEngineBase):
    def __init__(self, model: V41Model, options: EngineOptions, host: str = "127.0.0.1") -> None:
        if model.role != "full":
            raise ValueError("the symmetric prefill engine runs the full model")
        check_mode_semantics("prefill", options.semantics)
        super().__init__(model, options, host, "prefill", _compat(model, options))
        self._seed = 0  # fallback seeds of unseeded sampled requests, as the decode loop draws them

    def payload_manifest(self, req: GenerateRequest, split: SplitPlan):
        return state_manifest(split, self.row_format, self.model.dtype, sampled=not req.sampling.is_greedy)

    def encode(self, group: str, rows: torch.Tensor) -> np.ndarray:
        return encode_state_rows(group, rows, self.row_format, self.model.cfg)

    def compute_and_send(self, req: GenerateRequest, split: SplitPlan, sender, slots) -> dict[str, Any]:
        manifest = sender.manifest
        sent = {g.name: 0 for g in manifest.groups}
        streamed = [g for g in manifest.groups if streams(g.name)]
        meta = {"prompt_tokens_computed": split.prompt_len, "state_bytes": cache_bytes(manifest),
                "prefill_compute_s": 0.0}
        self._seed += 1
        cache = self.caches.new_request()
        try:
            shipping = [0.0]  # seconds spent shipping between chunks, not computing

            def after_chunk(c) -> bool:
                started = time.perf_counter()
                go_on = self.ship_ready(sender, c, streamed, slots, sent)
                shipping[0] += time.perf_counter() - started
                return go_on

            t0 = time.perf_counter()
            logits = prefill_prompt(self.model, cache, self.prompt_tensor(req), self.options.prefill_chunk, after_chunk)
            if logits is None:
                return meta  # D is gone or refused: nothing more to ship
            token, generator = sample_first(logits, req.sampling, self._seed)
            meta["prefill_compute_s"] = time.perf_counter() - t0 - shipping[0]
            self.ship_ready(sender, cache, streamed, slots, sent)
            final = extract_state(cache, manifest, tuple(g.name for g in manifest.groups if ships_at_end(g.name)))
            final.update(aux_rows(token, generator))
            for name, rows in final.items():
                self.ship(sender, name, rows, slots, sent)
            sender.finish()
        finally:
            cache.release()
        meta["first_token"] = token
        return meta


class SymmetricDecodeEngine(DecodeEngineBase):
    def __init__(self, model: V41Model, options: EngineOptions, host: str = "127.0.0.1") -> None:
        check_mode_semantics("decode", options.semantics)
        super().__init__(model, options, host, "decode", _compat(model, options))
        self._gate = JoinGate(min(options.max_running, options.scheduler.max_running))
        self._probe_seed = 0

    def decode(self, group: str, data: np.ndarray) -> torch.Tensor:
        return decode_state_rows(group, data, self.row_format, self.cfg, self.model.dtype)

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        self.require_bootstrap(req)
        split = self.split_for(req)
        prompt = self.prompt_tensor(req)
        if req.bootstrap.is_health_probe:  # SGLang's probe: no P behind it, prefill here
            self._probe_seed += 1
            local = await asyncio.get_running_loop().run_in_executor(
                self._probe_pool, prefill_locally, self.model, self._probe_caches, prompt, split,
                self.options.prefill_chunk, req.sampling, self._probe_seed)
            rows, first_token, generator, meta = local.rows, local.first.token, local.first.generator, {}
        else:
            manifest = state_manifest(split, self.row_format, self.model.dtype, sampled=not req.sampling.is_greedy)
            rows, error = await self.receive_rows(req, manifest)
            if error is not None:
                yield TokenEvent(req.rid, (), True, FinishReason.abort(error), error=error)
                return
            first_token, generator = int(rows[FIRST_TOKEN][0]), restore_generator(rows)
            rows = {name: t for name, t in rows.items() if name not in AUX_GROUPS}
            meta = {"payload_bytes": manifest.total_bytes}
        async for event in join_running(self.loop, self._gate, self.model, req, prompt, split, rows, first_token,
                                        generator, meta):
            yield event

