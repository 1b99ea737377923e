"""The colocated engine (`--disaggregation-mode null`): the full model in one process, computing the
same semantics as the disaggregated servers, so its outputs are the reference they must match.
Asymmetric semantics: prefix, then the window step, then decode (as asym-prefill + asym-decode);
`exact`: the full prompt forward and the first token, then decode (as symmetric PD)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import AsyncIterator

from ...asym import run_prefix_on_full_model
from ...cache import CacheSizing
from ...model import V41Model
from ...split import Semantics
from ..engine_api import EngineRole, GenerateRequest, TokenEvent
from .base import EngineBase
from .decode_loop import ActiveRequest, DecodeLoop, load_drafter
from .full_prefill import prefill_locally
from .options import EngineOptions
from .streaming import JoinGate, join_running, stream_from_loop


def _timed(fn, *args):
    """fn(*args) and its seconds, measured on the thread that runs it (queueing excluded)."""
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


class ColocatedEngine(EngineBase):
    role = EngineRole.COLOCATED

    def __init__(self, model: V41Model, options: EngineOptions) -> None:
        super().__init__(model.cfg, options, "null")
        self.model = model
        model.deterministic = options.deterministic
        sizing = CacheSizing(max_requests=options.max_running + 1, max_tokens=options.max_total_tokens,
                             page_rows=options.page_rows, max_chunk_tokens=options.window)
        self._prefix_caches = model.new_cache_set(CacheSizing(1, options.max_total_tokens, options.page_rows))
        self._prefix_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefix")
        self.loop = DecodeLoop(model, model.new_cache_set(sizing), options.scheduler, model.cfg.eos_token_id,
                               on_step=self._on_step, window_chunk=options.window_chunk,
                               drafter=load_drafter(model, options.model_path, options.scheduler.num_draft_tokens),
                               graph_backend=options.graph_backend)
        self._gate = JoinGate(min(options.max_running, options.scheduler.max_running))
        self._seed = 0  # fallback seeds of unseeded sampled requests (exact semantics)
        self.loop.start()

    def _on_step(self, record) -> None:
        if record.window_rows:
            self.metrics.observe_window_step(record.seconds, record.window_rows)
        self.metrics.count_forwards(record.graphs)

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        split = self.split_for(req)
        prompt = self.prompt_tensor(req)
        loop = asyncio.get_running_loop()
        if split.semantics is Semantics.EXACT:
            self._seed += 1
            local = await loop.run_in_executor(self._prefix_pool, prefill_locally, self.model, self._prefix_caches,
                                               prompt, split, self.options.prefill_chunk, req.sampling, self._seed)
            self.observe_prefill_compute(local.first.compute_s)
            meta = {"prefill_compute_s": local.first.compute_s}
            async for event in join_running(self.loop, self._gate, self.model, req, prompt, split, local.rows,
                                            local.first.token, local.first.generator, meta):
                yield event
            return
        prefix, compute_s = await loop.run_in_executor(
            self._prefix_pool, _timed, run_prefix_on_full_model, self.model, self._prefix_caches, prompt, split)
        self.observe_prefill_compute(compute_s)
        submit = lambda emit: self.loop.submit(ActiveRequest(req.rid, prompt, split, prefix, req.sampling, emit))  # noqa: E731
        async for event in stream_from_loop(self.loop, req.rid, submit, final_meta={"prefill_compute_s": compute_s}):
            yield event

    def cache_sets(self):
        return {"requests": self.loop.cache_set, "prefix": self._prefix_caches}

    async def abort(self, rid: str) -> None:
        self.loop.abort(rid)

    def shutdown(self) -> None:
        self.loop.stop()
        self._prefix_pool.shutdown(wait=False)
