"""The colocated engine reproduces the reference of its semantics (prefix, window step, greedy decode),
serves several requests at once, and frees every cache page when requests finish or are aborted."""

from __future__ import annotations

import asyncio

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.asym import run_reference
from sglang_asym.cache import CacheSizing
from sglang_asym.model.steps import greedy_continue
from sglang_asym.runtime.engine.colocated import ColocatedEngine
from sglang_asym.sched import SchedulerConfig
from sglang_asym.runtime.engine.options import EngineOptions
from sglang_asym.runtime.engine_api import FinishKind, GenerateRequest, SamplingParams
from sglang_asym.split import SplitPlan


@pytest.fixture(scope="module", params=[("mixed", None), ("separate", None), ("mixed", 32), ("separate", 7)],
                ids=["mixed", "separate", "mixed-chunk32", "separate-chunk7"])
def engine(request):
    """Mixed and separate step execution, whole or chunked windows: all give the reference's tokens."""
    mode, chunk = request.param
    model = build("tiny", seed=4, cache_quant="release")
    sched = SchedulerConfig(token_budget=140, max_window_rows_per_step=140, max_running=4, num_draft_tokens=0,
                            mode=mode)
    eng = ColocatedEngine(model, EngineOptions(model_path="tiny", max_total_tokens=1024, max_running=4,
                                               scheduler=sched, window_chunk=chunk))
    yield eng
    eng.shutdown()


def _reference(model, tokens, n_new):
    split = SplitPlan(model.cfg, tokens.numel(), 128, "asym-exact-encoder")
    cache_set = model.new_cache_set(CacheSizing(1, 1024))
    logits, cache = run_reference(model, cache_set, tokens, split)
    out, _ = greedy_continue(model, cache, logits, n_new)
    cache.release()
    return out


async def _collect(engine, req):
    tokens, last = [], None
    async for event in engine.generate(req):
        tokens += event.new_token_ids
        last = event
    return tokens, last


def test_concurrent_requests_match_reference(engine):
    lengths = [5, 128, 300]
    prompts = [prompt(engine.cfg, n, seed=n) for n in lengths]
    reqs = [GenerateRequest(f"r{i}", tuple(p.tolist()), SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True))
            for i, p in enumerate(prompts)]

    async def run_all():
        return await asyncio.gather(*(_collect(engine, r) for r in reqs))

    results = asyncio.run(run_all())
    for p, (tokens, last) in zip(prompts, results):
        assert tokens == _reference(engine.model, p, 6)
        assert last.finish_reason.kind is FinishKind.LENGTH and last.error is None
    assert engine.loop.active_requests == 0
    engine.loop.cache_set.check_no_leak()


def test_abort_mid_stream_frees_pages(engine):
    req = GenerateRequest("ab", tuple(prompt(engine.cfg, 200).tolist()),
                          SamplingParams(max_new_tokens=500, temperature=0, ignore_eos=True))

    async def run():
        got = 0
        async for event in engine.generate(req):
            got += len(event.new_token_ids)
            if got >= 2:
                break  # the client goes away: the generator is closed
        await asyncio.sleep(0)

    asyncio.run(run())
    for _ in range(100):
        if engine.loop.active_requests == 0:
            break
        import time
        time.sleep(0.05)
    assert engine.loop.active_requests == 0
    engine.loop.cache_set.check_no_leak()
