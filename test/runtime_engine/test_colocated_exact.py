"""The colocated engine with `--asym-semantics exact` (full prompt forward, first token, then decode:
symmetric PD's reference) reproduces an independent reference, greedy and seeded, joins requests
running under the max_running gate, ends requests on a first token that stops them, and frees every
page; the scheduler entry it relies on refuses a full batch."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from model.helpers import build, prompt
from sglang_asym.cache import CacheSizing
from sglang_asym.model.steps import prefill
from sglang_asym.runtime.engine.colocated import ColocatedEngine
from sglang_asym.runtime.engine.options import EngineOptions
from sglang_asym.runtime.engine.sampler import make_generator, sample
from sglang_asym.runtime.engine.streaming import JoinGate
from sglang_asym.runtime.engine_api import FinishKind, GenerateRequest, SamplingParams
from sglang_asym.sched import Scheduler, SchedulerConfig
from sglang_asym.sched.scheduler import QueueFullError

CHUNK = 64


@pytest.fixture(scope="module")
def engine():
    model = build("tiny", seed=4, cache_quant="release")
    sched = SchedulerConfig(token_budget=140, max_window_rows_per_step=140, max_running=2, num_draft_tokens=0)
    eng = ColocatedEngine(model, EngineOptions(model_path="tiny", semantics="exact", max_total_tokens=1024,
                                               max_running=2, prefill_chunk=CHUNK, scheduler=sched))
    yield eng
    eng.shutdown()


def _reference(model, tokens: torch.Tensor, params: SamplingParams) -> list[int]:
    cache = model.new_cache_set(CacheSizing(1, 1024, 64)).new_request()
    logits = prefill(model, cache, tokens, chunk=CHUNK)
    generator = make_generator(params, 0)
    out = []
    for _ in range(params.max_new_tokens):
        out.append(sample(logits, params, generator))
        logits = model(torch.tensor([out[-1]]), cache, logits="last")
    cache.release()
    return out


async def _collect(engine, req):
    tokens, last = [], None
    async for event in engine.generate(req):
        tokens += event.new_token_ids
        last = event
    return tokens, last


def _run(engine, reqs):
    async def all_of():
        return await asyncio.gather(*(_collect(engine, r) for r in reqs))

    return asyncio.run(all_of())


def test_more_requests_than_max_running_match_the_reference(engine):
    cases = [(n, p) for n in (1, 128, 129, 300) for p in (
        SamplingParams(max_new_tokens=5, temperature=0, ignore_eos=True),
        SamplingParams(max_new_tokens=5, temperature=0.8, top_k=50, seed=n, ignore_eos=True))]
    reqs = [GenerateRequest(f"r{i}", tuple(prompt(engine.cfg, n, seed=n).tolist()), p)
            for i, (n, p) in enumerate(cases)]
    results = _run(engine, reqs)
    for (n, params), (tokens, last) in zip(cases, results):
        assert tokens == _reference(engine.model, prompt(engine.cfg, n, seed=n), params), (n, params)
        assert last.finish_reason.kind is FinishKind.LENGTH and last.error is None
        assert last.meta["prefill_compute_s"] > 0
    assert engine.loop.active_requests == 0 and engine._gate.held == 0
    engine.loop.cache_set.check_no_leak()
    rendered = engine.metrics.render()
    assert b"sglang_asym:prefill_compute_seconds_count" in rendered
    forwards = {s.labels["graph_kind"]: s.value for family in text_string_to_metric_families(rendered.decode())
                for s in family.samples if s.name == "sglang_asym:decode_forwards_total"}
    counted = {kind: n for kind, n in engine.loop.graph_stats.forwards.items() if n}
    assert forwards == counted and sum(counted.values()) > 0  # /metrics shows the runner's forwards by shape


def test_first_token_can_end_the_request(engine):
    tokens = tuple(prompt(engine.cfg, 40, seed=3).tolist())
    first = _reference(engine.model, torch.tensor(tokens), SamplingParams(max_new_tokens=1, temperature=0))[0]
    reqs = [GenerateRequest("one", tokens, SamplingParams(max_new_tokens=1, temperature=0)),
            GenerateRequest("stop", tokens, SamplingParams(max_new_tokens=9, temperature=0, stop_token_ids=(first,))),
            GenerateRequest("none", tokens, SamplingParams(max_new_tokens=0, temperature=0))]
    (one, one_last), (stop, stop_last), (none, none_last) = _run(engine, reqs)
    assert one == [first] and one_last.finish_reason.to_json() == {"type": "length", "length": 1}
    assert stop == [first] and stop_last.finish_reason.to_json() == {"type": "stop", "matched": first}
    assert none == [] and none_last.finish_reason.to_json() == {"type": "length", "length": 0}
    engine.loop.cache_set.check_no_leak()


def test_abort_mid_stream_frees_pages_and_the_gate(engine):
    req = GenerateRequest("ab", tuple(prompt(engine.cfg, 200).tolist()),
                          SamplingParams(max_new_tokens=500, temperature=0, ignore_eos=True))

    async def run():
        got = 0
        async for event in engine.generate(req):
            got += len(event.new_token_ids)
            if got >= 2:
                break

    asyncio.run(run())
    deadline = time.monotonic() + 5
    while engine.loop.active_requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.loop.active_requests == 0 and engine._gate.held == 0
    engine.loop.cache_set.check_no_leak()


def test_scheduler_add_running_refuses_a_full_batch_or_a_known_id():
    sched = Scheduler(SchedulerConfig(token_budget=8, max_window_rows_per_step=8, max_running=2, num_draft_tokens=0,
                                      window=4))
    sched.add_running("a")
    with pytest.raises(ValueError, match="already running"):
        sched.add_running("a")
    sched.add_running("b")
    with pytest.raises(QueueFullError, match="max_running=2"):
        sched.add_running("c")
    step = sched.step()
    assert [r.request_id for r in step.plan.decode] == ["a", "b"] and not step.plan.admitted


def test_join_gate_bounds_holders():
    gate = JoinGate(2)
    assert gate.try_acquire() and gate.try_acquire() and not gate.try_acquire()
    gate.release()
    assert gate.try_acquire()
    gate.release()
    gate.release()
    with pytest.raises(RuntimeError, match="more often"):
        gate.release()
