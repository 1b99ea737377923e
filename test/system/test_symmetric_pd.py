"""Router + symmetric prefill + symmetric decode (`--disaggregation-mode prefill` / `decode`) on 127.0.0.1
with the small checkpoint: concurrent streaming and non-streaming requests give exactly the colocated
`--asym-semantics exact` server's outputs; a room D never gets and a reused room end with a clear
error and both workers keep serving."""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request

import pytest

from sglang_asym.testing.router_launch import RouterFlavor
from sglang_asym.testing.server_process import post, start_server

from .helpers import MODEL, finish_reason, ids, output, router_over, serving

pytestmark = pytest.mark.timeout(600)
TRANSFER_TIMEOUT_S = 6
GREEDY = {"max_new_tokens": 5, "temperature": 0}
LONG_TEXT = " ".join(f"word{i} of a prompt about symmetric disaggregation" for i in range(16))
REQUESTS = [
    ("/generate", {"input_ids": ids(1, 1), "sampling_params": GREEDY}),
    ("/generate", {"input_ids": ids(128, 2), "sampling_params": GREEDY, "stream": True}),  # exactly W
    ("/generate", {"input_ids": ids(129, 3), "sampling_params": GREEDY}),
    ("/generate", {"input_ids": ids(260, 4), "sampling_params": {"max_new_tokens": 5, "temperature": 0.5,
                                                                   "sampling_seed": 11}, "stream": True}),
    ("/v1/completions", {"model": MODEL, "prompt": LONG_TEXT, "max_tokens": 4, "temperature": 0}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 4,
                              "temperature": 0, "stream": True}),
]


def _output(path: str, body: dict, base: str):
    return output(path, body, base, detail=finish_reason)  # (output_ids, finish_reason) for /generate


@pytest.fixture(scope="module")
def servers(small_checkpoint, tmp_path_factory):
    logs = tmp_path_factory.mktemp("symmetric-logs")
    timeout = ("--transfer-timeout", str(TRANSFER_TIMEOUT_S))
    env = {"OMP_NUM_THREADS": "1"}  # three servers on a 2-core machine: oversubscribed threads only spin
    started = {"prefill": start_server("prefill", small_checkpoint, logs, *timeout, env=env),
               "decode": start_server("decode", small_checkpoint, logs, *timeout, env=env),
               "colocated": start_server("null", small_checkpoint, logs, "--asym-semantics", "exact", env=env)}
    with serving(started):
        yield started


@pytest.fixture(scope="module")
def router(servers):
    with router_over(servers["prefill"], servers["decode"], RouterFlavor.SGLANG_ROUTER) as proc:
        yield proc


def test_concurrent_requests_through_the_router_equal_colocated_exact(servers, router):
    with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
        futures = [pool.submit(_output, path, body, router.url) for path, body in REQUESTS]
        try:
            got = [f.result(timeout=400) for f in futures]
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nrouter log:\n{router.log_tail(40)}\nP log:\n"
                                 f"{servers['prefill'].log_tail()}\nD log:\n{servers['decode'].log_tail()}") from None
    want = [_output(path, body, servers["colocated"].url) for path, body in REQUESTS]
    for (path, body), have, expected in zip(REQUESTS, got, want):
        assert have == expected, (path, body.get("stream"))
    assert all(len(g[0]) == 5 for g in got[:4])
    with urllib.request.urlopen(servers["decode"].url + "/server_info", timeout=10) as resp:
        info = json.loads(resp.read())
    assert info["disaggregation_mode"] == "decode" and info["asym_semantics"] == "exact"


def test_prefill_answers_with_payload_meta_once_decode_verified(servers):
    """P's own answer (the router drops it): empty output, the payload bytes and its compute time; and
    both workers answer /health_generate."""
    p, d = servers["prefill"], servers["decode"]
    body = {"input_ids": ids(300, 8), "sampling_params": GREEDY, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": p.bootstrap_port, "bootstrap_room": 9001}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        p_answer = pool.submit(post, p.url + "/generate", body)
        d_answer = pool.submit(post, d.url + "/generate", body)
        (p_status, p_resp), (d_status, d_resp) = p_answer.result(300), d_answer.result(300)
    assert p_status == 200 and d_status == 200, (p_resp, d_resp)
    assert p_resp["output_ids"] == [] and len(d_resp["output_ids"]) == 5
    meta = p_resp["meta_info"]
    assert meta["prompt_tokens_computed"] == 300 and meta["prefill_compute_s"] > 0
    assert meta["payload_bytes"] == d_resp["meta_info"]["payload_bytes"] > meta["state_bytes"] > 0
    assert meta["first_token"] == d_resp["output_ids"][0]
    for server in (p, d):  # SGLang's probe: D prefills it locally, P answers without a transfer
        with urllib.request.urlopen(server.url + "/health_generate", timeout=60) as resp:
            assert resp.status == 200


def test_a_room_decode_never_gets_and_a_reused_room_fail_clearly(servers, router):
    d = servers["decode"]
    body = {"input_ids": ids(200, 6), "sampling_params": GREEDY, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": servers["prefill"].bootstrap_port, "bootstrap_room": 4343}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, d.url + "/generate", body)
        time.sleep(1.0)
        status, resp = post(d.url + "/generate", body)
        assert status == 409 and "4343" in json.dumps(resp), resp
        status, resp = first.result(timeout=TRANSFER_TIMEOUT_S + 60)
    assert status >= 500 or resp["meta_info"]["finish_reason"]["type"] == "abort", resp
    assert "transfer" in json.dumps(resp).lower(), resp
    assert _output("/generate", {"input_ids": ids(50, 7), "sampling_params": GREEDY}, router.url)[0]
