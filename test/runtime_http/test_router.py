"""The real PD routers (sglang-router 0.3.2, smg 1.13) in front of two HTTP fronts with fake P and D engines.

Pins what the routers do: the start-up calls, one copy of each request to P and to D with the same body
plus `bootstrap_host/port/room`, D's answer back to the client (JSON and SSE), and how a P failure
reaches the client (status, retries, what happens to D's copy).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import pytest

from sglang_asym.runtime.engine_api import EngineError, EngineRole, RequestRejectedError
from sglang_asym.runtime.http import HttpServerConfig
from sglang_asym.testing.router_launch import (
    PrefillWorker,
    RouterConfig,
    RouterFlavor,
    RouterProcess,
    RouterStartError,
    WorkerHealth,
    pick_free_port,
)

from .fakes import REPLY, FakeEngine
from .harness import ServedFront, post_json, post_sse, wait_until

P_BOOTSTRAP_PORT = 18998  # what the router advertises to D; nothing needs to listen there for these tests
RETRIES = 2
pytestmark = pytest.mark.timeout(120)


@dataclass
class PDSetup:
    prefill: ServedFront
    decode: ServedFront
    router: RouterProcess
    flavor: RouterFlavor
    startup_paths: dict[str, list[str]]


@pytest.fixture(scope="module", params=list(RouterFlavor), ids=lambda f: f.value)
def pd_setup(request, loop_thread, tokenizer, checkpoint_dir):
    config = HttpServerConfig(model_path=str(checkpoint_dir), served_model_name="tiny", port=0)
    prefill = loop_thread.serve(FakeEngine(tokenizer, EngineRole.PREFILL, transfer_delay_s=0.02, name="tiny"),
                                tokenizer, config)
    decode = loop_thread.serve(FakeEngine(tokenizer, EngineRole.DECODE, name="tiny"), tokenizer, config)
    router = RouterProcess(RouterConfig(
        prefill=(PrefillWorker(prefill.url, P_BOOTSTRAP_PORT),), decode=(decode.url,), port=pick_free_port(),
        flavor=request.param, retry_max_retries=RETRIES, extra_args=("--disable-circuit-breaker",)))
    try:
        router.start(ready_timeout_s=60)
        startup = {name: [r.path for r in front.recorded if r.method == "GET"]
                   for name, front in (("P", prefill), ("D", decode))}
        yield PDSetup(prefill, decode, router, request.param, startup)
    finally:
        router.stop()
        for front in (prefill, decode):
            loop_thread.call(front.server.stop())


@pytest.fixture
def pd(pd_setup):
    pd_setup.prefill.reset()
    pd_setup.decode.reset()
    return pd_setup


def test_router_reads_worker_info_at_start(pd_setup):
    for name in ("P", "D"):
        assert {"/health", "/server_info", "/model_info"} <= set(pd_setup.startup_paths[name]), pd_setup.startup_paths
    if pd_setup.flavor is RouterFlavor.SMG:
        assert "/v1/models" in pd_setup.startup_paths["P"]


CASES = {
    "generate": ("/generate", {"text": "hello world", "sampling_params": {
        "max_new_tokens": 32, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "sampling_seed": 7, "stop_token_ids": [1],
        "ignore_eos": False}}),
    "completions": ("/v1/completions", {"model": "tiny", "prompt": "hello world", "max_tokens": 32, "top_k": 5,
                                        "seed": 7, "stop_token_ids": [1]}),
    "chat": ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                      "max_completion_tokens": 32, "temperature": 0.5, "top_k": 5, "seed": 7}),
}


def as_float32(sampling: dict) -> dict:
    return {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in sampling.items()}


def check_pd_copies(pd: PDSetup, path: str, client_body: dict) -> tuple[dict, str, str]:
    """Both workers got one copy with the same body + bootstrap fields; returns (body, P rid, D rid)."""
    (p_copy,), (d_copy,) = pd.prefill.posts(path), pd.decode.posts(path)
    assert p_copy.body == d_copy.body
    body = p_copy.body
    assert body["bootstrap_host"] == "127.0.0.1" and body["bootstrap_port"] == P_BOOTSTRAP_PORT
    assert isinstance(body["bootstrap_room"], int) and 0 <= body["bootstrap_room"] < 1 << 63
    for key, value in client_body.items():
        if pd.flavor is RouterFlavor.SGLANG_ROUTER and key == "sampling_params":
            value = as_float32(value)  # sglang-router re-serializes sampling_params through f32
        assert body[key] == value, f"router changed {key}: {value!r} -> {body.get(key)!r}"
    (p_req,), (d_req,) = pd.prefill.engine.requests, pd.decode.engine.requests
    assert p_req.bootstrap == d_req.bootstrap and p_req.input_ids == d_req.input_ids
    assert p_req.rid != d_req.rid  # each server names its own copy: the client's id tells whose body it got
    return body, p_req.rid, d_req.rid


@pytest.mark.parametrize("case", list(CASES))
def test_request_reaches_both_workers_and_client_gets_decode_body(pd, case):
    path, client_body = CASES[case]
    status, body = post_json(pd.router.url, path, client_body)
    assert status == 200, body
    _, _, d_rid = check_pd_copies(pd, path, client_body)
    (d_copy,) = pd.decode.posts(path)
    assert body == json.loads(d_copy.response_body)  # byte-for-byte D's answer
    assert body.get("id", body.get("meta_info", {}).get("id")) == d_rid
    prompt_len = len(pd.decode.engine.requests[0].input_ids)
    text = {"generate": lambda b: b["text"], "completions": lambda b: b["choices"][0]["text"],
            "chat": lambda b: b["choices"][0]["message"]["content"]}[case](body)
    assert text == f"{prompt_len}:{REPLY}"


@pytest.mark.parametrize("case", list(CASES))
def test_streamed_request_reaches_both_workers_and_client_gets_decode_stream(pd, case):
    path, client_body = CASES[case]
    client_body = {**client_body, "stream": True}
    status, content_type, events = post_sse(pd.router.url, path, client_body)
    assert status == 200 and content_type.startswith("text/event-stream"), events
    _, _, d_rid = check_pd_copies(pd, path, client_body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    prompt_len = len(pd.decode.engine.requests[0].input_ids)
    if case == "generate":
        assert {c["meta_info"]["id"] for c in chunks} == {d_rid}
        assert chunks[-1]["text"] == f"{prompt_len}:{REPLY}"
    else:
        assert {c["id"] for c in chunks} == {d_rid}
        key = "text" if case == "completions" else "content"
        pieces = [c["choices"][0].get(key) or c["choices"][0].get("delta", {}).get(key, "") for c in chunks]
        assert "".join(pieces) == f"{prompt_len}:{REPLY}"


def test_batched_completion_sends_bootstrap_lists(pd):
    status, body = post_json(pd.router.url, "/v1/completions", {"model": "tiny", "prompt": ["ab", "hello"],
                                                               "max_tokens": 4})
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1]
    (p_copy,) = pd.prefill.posts("/v1/completions")
    rooms = p_copy.body["bootstrap_room"]
    assert p_copy.body["bootstrap_host"] == ["127.0.0.1"] * 2 and p_copy.body["bootstrap_port"] == [P_BOOTSTRAP_PORT] * 2
    assert len(set(rooms)) == 2
    assert sorted(r.bootstrap.room for r in pd.decode.engine.requests) == sorted(rooms)


def test_prefill_400_reaches_the_client_without_retry(pd):
    pd.prefill.engine.refuse_with = RequestRejectedError("prompt rejected by P")
    status, body = post_json(pd.router.url, "/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 2}})
    assert status == 400
    assert body["error"]["code"] == "prefill_bad_request"
    assert "Prefill server error (400 Bad Request)" in body["error"]["message"]
    assert "prompt rejected by P" in body["error"]["message"]
    assert len(pd.prefill.posts("/generate")) == 1


def test_prefill_500_is_retried_with_fresh_rooms_then_500(pd):
    pd.prefill.engine.refuse_with = EngineError("prefill worker crashed")
    status, body = post_json(pd.router.url, "/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 2}})
    assert status == 500
    assert body["error"]["code"] == "prefill_internal_error" and "prefill worker crashed" in body["error"]["message"]
    p_rooms = [c.body["bootstrap_room"] for c in pd.prefill.posts("/generate")]
    assert len(p_rooms) == RETRIES and len(set(p_rooms)) == RETRIES
    if pd.flavor is RouterFlavor.SMG:  # smg drops D's copy once P fails: a copy may never have been sent
        assert {c.body["bootstrap_room"] for c in pd.decode.posts("/generate")} <= set(p_rooms)
    else:  # sglang-router sends D a copy of every attempt and waits for it
        wait_until(lambda: len(pd.decode.posts("/generate")) == RETRIES, what="D copies of every attempt")
        assert sorted(c.body["bootstrap_room"] for c in pd.decode.posts("/generate")) == sorted(p_rooms)


def test_what_happens_to_the_decode_copy_when_prefill_fails(pd):
    pd.prefill.engine.refuse_with = RequestRejectedError("no")
    pd.prefill.engine.refuse_after_s = 0.2  # D's copy is running by then
    pd.decode.engine.token_delay_s = 0.05  # D's copy takes 2 s to finish on its own
    started = time.monotonic()
    status, _ = post_json(pd.router.url, "/generate", {"text": "ab", "sampling_params": {
        "max_new_tokens": 40, "ignore_eos": True}})
    elapsed = time.monotonic() - started
    assert status == 400
    (p_copy,) = pd.prefill.posts("/generate")
    # match D's copy by room: a late copy from an earlier test's retries may still reach D after reset()
    (d_request,) = [r for r in pd.decode.engine.requests if r.bootstrap.room == p_copy.body["bootstrap_room"]]
    if pd.flavor is RouterFlavor.SMG:  # answers when P fails and drops D's connection: D aborts
        assert elapsed < 1.5
        wait_until(lambda: d_request.rid in pd.decode.engine.aborted, what="D to see the disconnect")
    else:  # sglang-router waits for D's whole answer before it reports P's error; D is not aborted
        assert elapsed >= 2.0
        assert pd.decode.engine.aborted == []


def test_router_start_fails_fast_when_it_exits(tmp_path):
    bad = RouterProcess(RouterConfig(prefill=(PrefillWorker("http://127.0.0.1:1"),), decode=("http://127.0.0.1:2",),
                                     port=pick_free_port(), extra_args=("--no-such-flag",)), tmp_path / "r.log")
    with pytest.raises(RouterStartError, match="router exited with 2"):
        bad.start(ready_timeout_s=30)
    assert bad.pid is None


def test_router_config_validation():
    with pytest.raises(ValueError, match="at least one prefill and one decode worker"):
        RouterConfig(prefill=(), decode=("http://a:1",), port=1)
    with pytest.raises(ValueError, match="worker url must start with http"):
        RouterConfig(prefill=(PrefillWorker("a:1"),), decode=("http://a:1",), port=1)
    cmd = RouterConfig(prefill=(PrefillWorker("http://p:1", 9), PrefillWorker("http://q:1")), decode=("http://d:1",),
                       port=5, flavor=RouterFlavor.SMG, policy="round_robin").command(prometheus_port=7, python="py")
    assert cmd[:4] == ["py", "-m", "smg.launch_router", "--pd-disaggregation"]
    joined = " ".join(cmd)
    assert "--prefill http://p:1 9 --prefill http://q:1 --decode http://d:1" in joined
    assert "--prometheus-port 7" in joined and "--policy round_robin" in joined and "--port 5" in joined
    assert "circuit" not in joined and "health" not in joined  # the router's own defaults
    health = RouterConfig(prefill=(PrefillWorker("http://p:1"),), decode=("http://d:1",), port=5,
                          health=WorkerHealth(interval_s=3)).command(prometheus_port=7, python="py")
    assert health[-9:] == ["--disable-circuit-breaker", "--health-check-interval-secs", "3",
                           "--health-check-timeout-secs", "5", "--health-failure-threshold", "2",
                           "--health-success-threshold", "1"]
