"""The SIGTERM drain (HttpServer.drain, the path run_http_server takes on a signal): nothing new is admitted
(503), running requests finish inside the drain timeout, the rest end with finish_reason abort, never a
stream that just stops; /health answers 503 meanwhile."""

from __future__ import annotations

import http.client
import json

from sglang_asym.runtime.http.server import DRAIN_KEY

from .harness import get, parse_sse, wait_until


def _open_stream(port: int, rid: str,
                 max_new_tokens: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/generate", json.dumps({"text": "ab", "rid": rid, "stream": True, "sampling_params": {
        "max_new_tokens": max_new_tokens, "ignore_eos": True}}), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def _kept_alive(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    assert resp.status == 200
    resp.read()
    return conn


def _ask(conn: http.client.HTTPConnection, method: str, path: str, body=None) -> tuple[int, bytes]:
    conn.request(method, path, json.dumps(body) if body is not None else None,
                 {"Content-Type": "application/json"} if body is not None else {})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_drain_refuses_new_work_and_aborts_what_outlives_it(serve, loop_thread):
    front = serve(token_delay_s=0.05)
    kept = _kept_alive(front.port)  # a router's pooled connection: open before the drain, reused during it
    conn, resp = _open_stream(front.port, "long", 200)  # 200 tokens x 50 ms: far past the drain timeout
    wait_until(lambda: front.engine.requests, what="request admitted")
    drained = loop_thread.call_soon(front.server.drain(0.5))
    wait_until(lambda: front.server._runner.app[DRAIN_KEY].draining, what="draining")
    status, body = _ask(kept, "POST", "/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 2}})
    assert status == 503
    assert json.loads(body)["error"]["message"] == "the server is shutting down: no new requests are admitted"
    kept.close()
    late, refused = _open_stream(front.port, "late", 2)  # a new connection: refused the same way
    assert refused.status == 503
    late.close()
    assert get(front.url, "/health")[0] == 503 and get(front.url, "/health_generate")[0] == 503
    assert get(front.url, "/server_info")[0] == 200  # introspection still answers
    events = parse_sse(resp.read())
    conn.close()
    assert drained.result(10) == ("long",)
    assert events[-1] == "[DONE]"
    assert events[-2]["meta_info"]["finish_reason"] == {"type": "abort", "message": "Aborted"}
    assert 0 < events[-2]["meta_info"]["completion_tokens"] < 200
    assert front.engine.aborted == ["long"]


def test_drain_lets_running_requests_finish(serve, loop_thread):
    front = serve(token_delay_s=0.01)
    conn, resp = _open_stream(front.port, "short", 20)  # 20 tokens x 10 ms: well inside the drain timeout
    wait_until(lambda: front.engine.requests, what="request admitted")
    drained = loop_thread.call_soon(front.server.drain(10.0))
    events = parse_sse(resp.read())
    conn.close()
    assert drained.result(10) == ()
    assert events[-2]["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
    assert front.engine.aborted == []
