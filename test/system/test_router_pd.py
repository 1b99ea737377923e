"""Router + asym-prefill + asym-decode on 127.0.0.1 with the small checkpoint: concurrent streaming and
non-streaming requests (generate, completions, chat) give exactly the colocated server's outputs,
and bad input gets a clear 4xx while the servers keep serving."""

from __future__ import annotations

import concurrent.futures
import json
import urllib.request

import pytest

from sglang_asym.testing.router_launch import RouterFlavor
from sglang_asym.testing.server_process import post

from .conftest import D_TRANSFER_TIMEOUT_S
from .helpers import MODEL, ids, output, router_over

pytestmark = pytest.mark.timeout(900)
GREEDY = {"max_new_tokens": 6, "temperature": 0}
LONG_TEXT = " ".join(f"word{i} of a long prompt about the asymmetric split" for i in range(60))
REQUESTS = [
    ("/generate", {"input_ids": ids(40, 1), "sampling_params": GREEDY}),
    ("/generate", {"input_ids": ids(128, 2), "sampling_params": GREEDY}),  # exactly W: P runs nothing
    ("/generate", {"input_ids": ids(129, 3), "sampling_params": GREEDY}),  # B = 1, odd
    ("/generate", {"input_ids": ids(600, 4), "sampling_params": GREEDY, "stream": True}),
    ("/generate", {"text": LONG_TEXT, "sampling_params": {"max_new_tokens": 6, "temperature": 0.5, "sampling_seed": 11}}),
    ("/v1/completions", {"model": MODEL, "prompt": LONG_TEXT, "max_tokens": 5, "temperature": 0}),
    ("/v1/completions", {"model": MODEL, "prompt": "short prompt", "max_tokens": 5, "temperature": 0, "stream": True}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": LONG_TEXT}], "max_tokens": 5,
                              "temperature": 0}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 5,
                              "temperature": 0, "stream": True}),
]


@pytest.fixture(scope="module")
def colocated_outputs(cluster):
    return [output(path, body, cluster["colocated"].url) for path, body in REQUESTS]


@pytest.fixture(scope="module", params=list(RouterFlavor), ids=lambda f: f.value)
def router(cluster, request):
    with router_over(cluster["prefill"], cluster["decode"], request.param) as proc:
        yield proc


def test_concurrent_requests_through_router_equal_colocated(router, colocated_outputs):
    with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
        futures = [pool.submit(output, path, body, router.url) for path, body in REQUESTS]
        try:
            got = [f.result(timeout=600) for f in futures]
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nrouter log:\n{router.log_tail(60)}") from None
    for (path, body), want, have in zip(REQUESTS, colocated_outputs, got):
        assert have == want, (path, body.get("stream"))
    assert all(len(g[0]) > 0 if isinstance(g, tuple) else len(g) > 0 for g in got)


def test_prefill_answers_with_an_empty_well_formed_response(cluster):
    """The P server alone: a request with bootstrap fields for a D that never connects fails cleanly."""
    status, resp = post(cluster["prefill"].url + "/generate",
                        {"input_ids": ids(300, 9), "sampling_params": GREEDY, "bootstrap_host": "127.0.0.1",
                         "bootstrap_port": cluster["prefill"].bootstrap_port, "bootstrap_room": 77})
    assert status in (200, 500)
    text = json.dumps(resp)
    assert "transfer" in text or resp.get("output_ids") == []


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "json"),
    ({"sampling_params": GREEDY}, "text"),
    ({"text": "", "sampling_params": GREEDY}, "empty"),
    ({"input_ids": ids(9000, 5), "sampling_params": GREEDY}, "context"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 10 ** 9}}, "max_new_tokens"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 3, "frobnicate": 1}}, "frobnicate"),
])
def test_bad_input_is_a_clear_4xx_on_every_server(cluster, body, fragment):
    for name in ("colocated", "prefill", "decode"):
        if isinstance(body, dict) and name != "colocated":
            body = {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 5}
        status, resp = post(cluster[name].url + "/generate", body)
        assert 400 <= status < 500, (name, status, resp)
        assert fragment.lower() in json.dumps(resp).lower(), (name, resp)
    assert post(cluster["colocated"].url + "/generate", {"text": "still alive", "sampling_params": GREEDY})[0] == 200


def test_missing_bootstrap_fields_are_refused(cluster):
    for name in ("prefill", "decode"):
        status, resp = post(cluster[name].url + "/generate", {"text": "hello", "sampling_params": GREEDY})
        assert status == 400 and "bootstrap" in json.dumps(resp), (name, resp)


def test_reused_room_and_a_prefix_that_never_arrives(cluster):
    """D waits for a room P never serves: a second request with the same room gets 409 at once, the first
    ends with a clear transfer error after the timeout, its rows are freed and D keeps serving."""
    d = cluster["decode"]
    body = {"input_ids": ids(300, 6), "sampling_params": GREEDY, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": cluster["prefill"].bootstrap_port, "bootstrap_room": 4242}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, d.url + "/generate", body)
        import time

        time.sleep(1.0)
        status, resp = post(d.url + "/generate", body)
        assert status == 409 and "4242" in json.dumps(resp), resp
        status, resp = first.result(timeout=D_TRANSFER_TIMEOUT_S + 60)
    assert status >= 500 or resp.get("meta_info", {}).get("finish_reason", {}).get("type") == "abort", resp
    assert "transfer" in json.dumps(resp).lower(), resp
    with urllib.request.urlopen(d.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert "sglang_asym" in metrics or "sglang:" in metrics
