"""Symmetric PD's engines (prefill + decode, each in its own spawned process with its Mooncake engine)
reproduce the colocated `exact` engine token for token, greedy and seeded, for N in {1, W, W+1, 300};
P ships exactly the symmetric manifest's bytes plus the aux rows; a room D never gets fails cleanly."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import pytest

from model.helpers import build, prompt
from runtime_engine.engine_agent import engine_options
from sglang_asym.runtime.engine.colocated import ColocatedEngine
from sglang_asym.runtime.engine.request_state import RNG_STATE_BYTES
from sglang_asym.runtime.engine_api import GenerateRequest, SamplingParams
from sglang_asym.split import SplitPlan
from support.loopback_rpc import AgentProcess

pytestmark = pytest.mark.timeout(300)
SEED, W = 4, 128
LENGTHS = (1, W, W + 1, 300)
GREEDY = {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True}
SEEDED = {"max_new_tokens": 5, "temperature": 0.8, "top_p": 0.9, "seed": 21, "ignore_eos": True}
D_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def agents():
    target = "runtime_engine.engine_agent:EngineAgent"
    p = AgentProcess(target, mode="prefill", seed=SEED, semantics="exact", transfer_timeout_s=D_TIMEOUT_S)
    d = AgentProcess(target, mode="decode", seed=SEED, semantics="exact", transfer_timeout_s=D_TIMEOUT_S)
    try:
        yield p, d
    finally:
        p.stop()
        d.stop()


@pytest.fixture(scope="module")
def colocated():
    engine = ColocatedEngine(build("tiny", seed=SEED, cache_quant="release"), engine_options("exact"))
    yield engine
    engine.shutdown()


def _specs(p_port: int) -> list[dict]:
    specs = []
    for n in LENGTHS:
        for name, sampling in (("greedy", GREEDY), ("seeded", SEEDED)):
            specs.append({"rid": f"{name}-{n}", "input_ids": prompt(build("tiny", SEED).cfg, n, seed=n).tolist(),
                          "sampling": sampling,
                          "bootstrap": {"host": "127.0.0.1", "port": p_port, "room": 1000 + len(specs)}})
    return specs


def _run_pd(p, d, p_specs, d_specs, timeout_s=240):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        p_out = pool.submit(p.call, "run", requests=p_specs, rpc_timeout_s=timeout_s)
        d_out = pool.submit(d.call, "run", requests=d_specs, rpc_timeout_s=timeout_s)
        return p_out.result(), d_out.result()


def _colocated_tokens(engine, specs) -> list[list[int]]:
    async def one(spec):
        req = GenerateRequest(spec["rid"], tuple(spec["input_ids"]), SamplingParams(**spec["sampling"]))
        return [t async for event in engine.generate(req) for t in event.new_token_ids]

    async def all_of():
        return await asyncio.gather(*(one(s) for s in specs))

    return asyncio.run(all_of())


def test_outputs_equal_colocated_exact_and_payload_is_the_symmetric_manifest(agents, colocated):
    p, d = agents
    specs = _specs(p.info["bootstrap_port"])
    p_results, d_results = _run_pd(p, d, specs, specs)
    want = _colocated_tokens(colocated, specs)
    cfg = colocated.cfg
    for spec, p_res, d_res, tokens in zip(specs, p_results, d_results, want):
        n, sampled = len(spec["input_ids"]), spec["sampling"]["temperature"] > 0
        assert d_res.get("error", "refused") is None and p_res.get("error", "refused") is None, (spec["rid"], p_res, d_res)
        assert d_res["tokens"] == tokens, spec["rid"]
        assert d_res["finish"] == {"type": "length", "length": 5}
        assert p_res["tokens"] == [] and p_res["finish"] == {"type": "length", "length": 0}
        symmetric = SplitPlan(cfg, n, W, "exact").symmetric_manifest().total_bytes
        aux = 8 + (RNG_STATE_BYTES if sampled else 0)
        assert p_res["meta"]["state_bytes"] == symmetric, spec["rid"]
        assert p_res["meta"]["payload_bytes"] == symmetric + aux == d_res["meta"]["payload_bytes"], spec["rid"]
        assert p_res["meta"]["prompt_tokens_computed"] == n
        assert p_res["meta"]["first_token"] == tokens[0]
        assert p_res["meta"]["prefill_compute_s"] > 0
    assert p.call("state") == {"active": 0, "free_source_slots": True}
    assert d.call("state") == {"active": 0, "free_source_slots": True}


def test_a_room_decode_never_gets_and_a_reused_room_fail_cleanly(agents):
    """D waits for a room P never serves: it ends with a transfer error after the bootstrap timeout; a
    second D request reusing the room is refused at once; both workers then still serve."""
    p, d = agents
    spec = _specs(p.info["bootstrap_port"])[4]  # W + 1 tokens, greedy
    lonely = {**spec, "rid": "lonely", "bootstrap": {**spec["bootstrap"], "room": 77}}
    twin = {**lonely, "rid": "twin"}
    started = time.monotonic()
    result, refused = d.call("run", requests=[lonely, twin], rpc_timeout_s=60)
    assert "prefix transfer failed" in result["error"] and result["finish"]["type"] == "abort", result
    assert D_TIMEOUT_S <= time.monotonic() - started < 30
    assert "BootstrapRoomInUseError" in refused["refused"] and "77" in refused["refused"], refused
    good = {**spec, "bootstrap": {**spec["bootstrap"], "room": 78}}
    p_res, d_res = _run_pd(p, d, [good], [good])
    assert d_res[0]["error"] is None and len(d_res[0]["tokens"]) == 5 and p_res[0]["error"] is None
    assert d.call("state") == {"active": 0, "free_source_slots": True}
