"""The colocated engine (`--disaggregation-mode null`): the full model in one process, computing the
same semantics as the asymmetric split (prefix, then the window step, then decode), so its outputs
are the reference the disaggregated servers must match."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import AsyncIterator

from ...asym import run_prefix_on_full_model
from ...cache import CacheSizing
from ...model import V41Model
from ..engine_api import EngineRole, GenerateRequest, TokenEvent
from .base import EngineBase, EventStream
from .decode_loop import ActiveRequest, DecodeLoop
from .options import EngineOptions


class ColocatedEngine(EngineBase):
    role = EngineRole.COLOCATED

    def __init__(self, model: V41Model, options: EngineOptions) -> None:
        super().__init__(model.cfg, options, "null")
        self.model = model
        sizing = CacheSizing(max_requests=options.max_running + 1, max_tokens=options.max_total_tokens,
                             page_rows=options.page_rows, max_chunk_tokens=options.window)
        self._prefix_caches = model.new_cache_set(CacheSizing(1, options.max_total_tokens, options.page_rows))
        self._prefix_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefix")
        self.loop = DecodeLoop(model, model.new_cache_set(sizing), options.scheduler, model.cfg.eos_token_id,
                               on_step=self._on_step, window_chunk=options.window_chunk)
        self.loop.start()

    def _on_step(self, record) -> None:
        if record.window_rows:
            self.metrics.observe_window_step(record.seconds, record.window_rows)

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        split = self.split_for(req)
        prompt = self.prompt_tensor(req)
        prefix = await asyncio.get_running_loop().run_in_executor(
            self._prefix_pool, run_prefix_on_full_model, self.model, self._prefix_caches, prompt, split)
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

    async def abort(self, rid: str) -> None:
        self.loop.abort(rid)

    def shutdown(self) -> None:
        self.loop.stop()
        self._prefix_pool.shutdown(wait=False)
