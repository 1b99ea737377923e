"""Faults and recovery on one shared P + D + router stack (tiny checkpoint, sglang-router with its circuit
breaker on): aborts, clients gone before the first token, D and then P frozen (SIGSTOP) past the transfer
timeout, D killed (-9) mid-stream and mid-transfer and restarted on its port, P killed and restarted, D and
P drained by SIGTERM, and more requests than D runs at once.
Each scenario states its bound: the client gets an HTTP error status or an SSE error event (or its full
answer) within it; the surviving worker keeps serving; every pool returns exactly to its start value; the
next request through the router is served. Measured times go to $SGLANG_ASYM_RELIABILITY_OUT."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import time
import urllib.error
import urllib.request

import pytest

from sglang_asym.testing.server_process import post

from .faults import D_TRANSFER_TIMEOUT_S, first_event, open_stream, pools, read_stream, record, stack, wait_pools

pytestmark = pytest.mark.timeout(120)

D_MAX_RUNNING = 2  # D runs this many requests at once; more wait in its queue
POOLS_BACK_S = 15.0  # a worker's pools are at their start values this long after the fault ends at most
ABORT_END_S = 2.0  # an aborted stream ends (finish_reason abort) this long after /abort_request at most
# A request reaching P while D cannot answer: P gives up on D after its transfer timeout; the router answers
DEAD_D_ANSWER_S = D_TRANSFER_TIMEOUT_S + 3.0
# An abort that reaches a worker before the router's copy of the request does finds no such rid (a no-op,
# as in SGLang): P then computes the prefix and gives up on the aborted D after its transfer timeout
ABORT_ANSWER_S = D_TRANSFER_TIMEOUT_S + 10.0
FROZEN_S = D_TRANSFER_TIMEOUT_S + 3.0  # how long D stays stopped: past P's wait for D's handshake
THAWED_ERROR_S = 5.0  # after SIGCONT, the request sent while D was frozen fails this long after at most
RESTART_SERVE_S = 10.0  # from a restarted D healthy to the first request served through the router
QUARANTINED_BACK_S = 30.0 + D_TRANSFER_TIMEOUT_S + 10.0  # TransferConfig.quarantine_grace_s after the failure
DRAIN_EXIT_S = 15.0  # D exits this long after its last running stream ended at most


def ids(n: int, seed: int) -> list[int]:
    """n deterministic token ids inside the tiny checkpoint's vocabulary (512, above its special ids)."""
    return [(seed * 7919 + i * 104729) % 500 + 3 for i in range(n)]


def stream_body(seed: int, n_in: int = 300, n_out: int = 120) -> dict:
    return {"input_ids": ids(n_in, seed),
            "sampling_params": {"max_new_tokens": n_out, "temperature": 0, "ignore_eos": True},  # exact lengths
            "rid": f"fault-{seed}-{time.monotonic_ns()}"}


def small(seed: int) -> dict:
    return {"input_ids": ids(200, seed), "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}


def served(router_url: str, seed: int) -> bool:
    status, body = post(router_url + "/generate", small(seed), 60)
    assert status == 200, body
    return body["meta_info"]["completion_tokens"] == 4


def send_stream(url: str, body: dict) -> http.client.HTTPConnection:
    """A streaming /generate sent without waiting for the response's headers."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    return conn


def abort(url: str, rid: str) -> int:
    req = urllib.request.Request(url + "/abort_request", data=json.dumps({"rid": rid}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def health_generate(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health_generate", timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def pair(tiny_checkpoint, tmp_path_factory):
    with stack(tiny_checkpoint, tmp_path_factory.mktemp("fault-recovery"),
               decode_extra=("--max-running-requests", str(D_MAX_RUNNING))) as s:
        s.start_pools = {"prefill": pools(s.prefill), "decode": pools(s.decode)}
        yield s


def pools_back(pair) -> dict:
    return {"prefill_s": round(wait_pools(pair.prefill, pair.start_pools["prefill"], POOLS_BACK_S), 3),
            "decode_s": round(wait_pools(pair.decode, pair.start_pools["decode"], POOLS_BACK_S), 3)}


def test_abort_request_reaches_both_workers(pair):
    router = pair.router.url
    body = stream_body(1)
    conn, resp = open_stream(router, body, 60)
    events = first_event(resp)
    assert events[0]["meta_info"]["id"] == body["rid"]  # the router passes the client's rid to the workers
    # sglang-router 0.3.2 serves no /abort_request: an abort goes to each worker under that rid
    assert abort(router, body["rid"]) == 404
    sent = time.monotonic()
    assert abort(pair.decode.url, body["rid"]) == 200 and abort(pair.prefill.url, body["rid"]) == 200
    end = read_stream(resp, sent, events)
    conn.close()
    last = end.events[-1]["meta_info"]
    assert end.done and end.error is None and end.seconds < ABORT_END_S
    assert last["finish_reason"] == {"type": "abort", "message": "Aborted"}
    assert 0 < last["completion_tokens"] < body["sampling_params"]["max_new_tokens"]
    back = pools_back(pair)
    assert served(router, 2)
    record("abort_request_mid_stream", bound_s=ABORT_END_S, stream_end_after_abort_s=round(end.seconds, 3),
           tokens_before_abort=last["completion_tokens"], router_abort_route_status=404, pools_back=back)


def test_abort_before_the_first_token(pair):
    """Aborted while P computes a long prefix and D waits for it: the client is answered, nothing leaks."""
    router = pair.router.url
    body = stream_body(3, n_in=3000, n_out=8)
    conn = send_stream(router, body)  # the router sends its headers only once P has answered
    time.sleep(0.3)
    sent = time.monotonic()
    assert abort(pair.prefill.url, body["rid"]) == 200 and abort(pair.decode.url, body["rid"]) == 200
    end = read_stream(conn.getresponse(), sent)
    conn.close()
    print(f"abort before first token: status {end.status}, {end.seconds:.2f} s, done {end.done}, {end.error}, "
          f"{[e.get('meta_info', e) for e in end.events]}")
    # an HTTP error, an SSE error event, or an abort finish: never a silent hang, never a normal finish
    reasons = [e["meta_info"]["finish_reason"] for e in end.events if "meta_info" in e]
    assert end.seconds < ABORT_ANSWER_S
    assert end.error is not None or end.status != 200 or (reasons and reasons[-1]["type"] == "abort")
    back = pools_back(pair)
    assert served(router, 4)
    record("abort_request_before_first_token", bound_s=ABORT_ANSWER_S, answered_after_abort_s=round(end.seconds, 3),
           http_status=end.status, error=end.error, pools_back=back)


def test_client_gone_before_the_first_token(pair):
    """Clients that disconnect while P computes the prefix, while it is in transfer, and in D's window step."""
    router = pair.router.url
    backs = {}
    for delay in (0.2, 0.6, 1.2):
        conn = send_stream(router, stream_body(5, n_in=3000, n_out=50))
        time.sleep(delay)
        conn.close()
        backs[str(delay)] = pools_back(pair)
    assert served(router, 6)
    record("client_disconnect_before_first_token", bound_s=POOLS_BACK_S, disconnect_after_s=[0.2, 0.6, 1.2],
           pools_back=backs)


def test_frozen_decode_past_the_transfer_timeout(pair):
    """SIGSTOP D with a stream decoding on it and a new request arriving, past P's transfer timeout, then
    SIGCONT: P stays healthy and clean meanwhile, the new request fails clearly, the running one finishes."""
    router = pair.router.url
    running = stream_body(7, n_out=60)
    conn, resp = open_stream(router, running, 60)
    events = first_event(resp)
    os.kill(pair.decode.proc.pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            arriving = pool.submit(post, router + "/generate", small(8), 60)
            assert health_generate(pair.prefill.url) == 200  # P serves while D is frozen
            p_clean_s = wait_pools(pair.prefill, pair.start_pools["prefill"], FROZEN_S)
            time.sleep(max(0.0, FROZEN_S - (time.monotonic() - frozen)))
            os.kill(pair.decode.proc.pid, signal.SIGCONT)
            thawed = time.monotonic()
            status, body = arriving.result(timeout=THAWED_ERROR_S + 30)
            error_after_thaw = time.monotonic() - thawed
    finally:
        os.kill(pair.decode.proc.pid, signal.SIGCONT)
    end = read_stream(resp, thawed, events)
    conn.close()
    assert status >= 500 and "error" in body, body
    assert error_after_thaw < THAWED_ERROR_S
    # the stream that was decoding when D froze resumes and finishes whole
    assert end.done and end.error is None and end.events[-1]["meta_info"]["completion_tokens"] == 60
    back = pools_back(pair)
    assert served(router, 9)
    record("sigstop_decode_past_transfer_timeout", frozen_s=FROZEN_S, transfer_timeout_s=D_TRANSFER_TIMEOUT_S,
           bound_after_sigcont_s=THAWED_ERROR_S, new_request_status=status,
           new_request_error=body["error"].get("message", "")[:200],
           new_request_error_after_sigcont_s=round(error_after_thaw, 3),
           prefill_pools_clean_while_frozen_s=round(p_clean_s, 3),
           running_stream_finished_after_sigcont_s=round(end.seconds, 3), pools_back=back)


def test_frozen_prefill_past_the_transfer_timeout(pair):
    """SIGSTOP P while it computes one request's prefix and another arrives, past D's transfer timeout, then
    SIGCONT: D stays healthy and fails both rooms meanwhile, both clients get an error soon after SIGCONT,
    and D's quarantined landing extents come back when the resumed P confirms it stopped writing."""
    router = pair.router.url
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        computing = pool.submit(post, router + "/generate", stream_body(50, n_in=3000, n_out=8), 60)
        time.sleep(0.5)  # P is computing the 3000-token prefix
        os.kill(pair.prefill.proc.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            arriving = pool.submit(post, router + "/generate", small(51), 60)
            assert health_generate(pair.decode.url) == 200  # D serves while P is frozen
            time.sleep(max(0.0, FROZEN_S - (time.monotonic() - frozen)))
            quarantined = pools(pair.decode)["transfer"]["pools"]["landing"]["quarantined"]
            os.kill(pair.prefill.proc.pid, signal.SIGCONT)
            thawed = time.monotonic()
            answers = [f.result(timeout=THAWED_ERROR_S + 30) for f in (computing, arriving)]
            error_after_thaw = time.monotonic() - thawed
        finally:
            os.kill(pair.prefill.proc.pid, signal.SIGCONT)
    for status, body in answers:
        assert status >= 500 and "prefix transfer failed" in body["error"]["message"], body
    assert error_after_thaw < THAWED_ERROR_S
    assert quarantined > 0  # D held the failed rooms' landing rows while P could still be writing
    back = pools_back(pair)
    assert served(router, 52)
    record("sigstop_prefill_past_transfer_timeout", frozen_s=FROZEN_S, transfer_timeout_s=D_TRANSFER_TIMEOUT_S,
           bound_after_sigcont_s=THAWED_ERROR_S, statuses=[status for status, _ in answers],
           errors=[body["error"]["message"][:160] for _, body in answers],
           errors_after_sigcont_s=round(error_after_thaw, 3), decode_landing_rows_quarantined=quarantined,
           pools_back=back)


def test_killed_decode_restarts_on_its_port(pair):
    """kill -9 D mid-stream: the stream ends, requests while D is dead fail within DEAD_D_ANSWER_S and do not
    take P out of the router's rotation; D restarted on its port serves again within RESTART_SERVE_S."""
    router = pair.router.url
    conn, resp = open_stream(router, stream_body(10), 60)
    events = first_event(resp)
    killed = time.monotonic()
    os.kill(pair.decode.proc.pid, signal.SIGKILL)
    end = read_stream(resp, killed, events)
    conn.close()
    pair.decode.proc.wait(10)
    assert not end.done and end.error and end.seconds < 5.0
    dead = []
    for seed in (11, 12, 13):
        sent = time.monotonic()
        status, body = post(router + "/generate", small(seed), 60)
        dead.append((status, round(time.monotonic() - sent, 3)))
        assert status >= 500 and "error" in body, body
    assert max(seconds for _, seconds in dead) < DEAD_D_ANSWER_S
    assert health_generate(pair.prefill.url) == 200
    p_back = round(wait_pools(pair.prefill, pair.start_pools["prefill"], POOLS_BACK_S), 3)
    restarted = time.monotonic()
    startup_s = pair.restart_decode()
    healthy = time.monotonic()
    while True:
        status, _ = post(router + "/generate", small(14), 60)
        if status == 200:
            break
        assert time.monotonic() - healthy < RESTART_SERVE_S, "the restarted D is not served through the router"
        time.sleep(0.2)
    serve_again_s = time.monotonic() - healthy
    assert all(served(router, 15 + i) for i in range(3))  # P stayed in rotation: every request is served
    back = pools_back(pair)
    record("kill9_decode_mid_stream_then_restart", stream_end_bound_s=5.0, stream_end_s=round(end.seconds, 3),
           dead_decode_bound_s=DEAD_D_ANSWER_S, requests_while_dead=dead, prefill_pools_back_s=p_back,
           decode_startup_s=round(startup_s, 3), serve_again_bound_after_healthy_s=RESTART_SERVE_S,
           serve_again_after_healthy_s=round(serve_again_s, 3),
           serve_again_after_restart_s=round(time.monotonic() - restarted, 3), pools_back=back)


def test_killed_prefill_restarts_on_its_ports(pair):
    """kill -9 P while a stream decodes on D: that stream (P's part done) finishes whole; requests while P is
    dead fail within DEAD_D_ANSWER_S; P restarted on its HTTP and bootstrap ports serves again within
    RESTART_SERVE_S of being healthy, and D takes transfers from the new P."""
    router = pair.router.url
    conn, resp = open_stream(router, stream_body(60, n_out=60), 60)
    events = first_event(resp)
    killed = time.monotonic()
    os.kill(pair.prefill.proc.pid, signal.SIGKILL)
    pair.prefill.proc.wait(10)
    dead = []
    for seed in (61, 62):
        sent = time.monotonic()
        status, body = post(router + "/generate", small(seed), 60)
        dead.append((status, round(time.monotonic() - sent, 3)))
        assert status >= 500 and "error" in body, body
    end = read_stream(resp, killed, events)
    conn.close()
    assert end.done and end.error is None and end.events[-1]["meta_info"]["completion_tokens"] == 60
    assert max(seconds for _, seconds in dead) < DEAD_D_ANSWER_S
    assert health_generate(pair.decode.url) == 200
    startup_s = pair.restart_prefill()
    healthy = time.monotonic()
    while post(router + "/generate", small(63), 60)[0] != 200:
        assert time.monotonic() - healthy < RESTART_SERVE_S, "the restarted P is not served through the router"
        time.sleep(0.2)
    serve_again_s = time.monotonic() - healthy
    assert all(served(router, 64 + i) for i in range(3))
    # D's rooms of the requests P never served wait out their quarantine grace (a dead P cannot confirm)
    back = {"prefill_s": round(wait_pools(pair.prefill, pair.start_pools["prefill"], POOLS_BACK_S), 3),
            "decode_s": round(wait_pools(pair.decode, pair.start_pools["decode"], QUARANTINED_BACK_S), 3)}
    record("kill9_prefill_then_restart", stream_on_decode_finished_s=round(end.seconds, 3),
           dead_prefill_bound_s=DEAD_D_ANSWER_S, requests_while_dead=dead, prefill_startup_s=round(startup_s, 3),
           serve_again_bound_after_healthy_s=RESTART_SERVE_S, serve_again_after_healthy_s=round(serve_again_s, 3),
           pools_back=back)


def test_sigterm_drains_decode(pair):
    """SIGTERM D with a stream decoding on it: that stream finishes whole, a new request fails clearly, D
    exits 0; D restarted on its port serves again."""
    router = pair.router.url
    running = stream_body(20, n_out=100)
    conn, resp = open_stream(router, running, 60)
    events = first_event(resp)
    term = time.monotonic()
    os.kill(pair.decode.proc.pid, signal.SIGTERM)
    time.sleep(0.3)
    status, body = post(router + "/generate", small(21), 60)
    refused_s = time.monotonic() - term
    end = read_stream(resp, term, events)
    conn.close()
    stream_done = time.monotonic()
    exit_code = pair.decode.proc.wait(DRAIN_EXIT_S)
    exited = time.monotonic()
    assert status >= 500 and "error" in body and refused_s < DEAD_D_ANSWER_S + 0.3, (status, body)
    assert end.done and end.error is None and end.events[-1]["meta_info"]["completion_tokens"] == 100
    assert exit_code == 0
    p_back = round(wait_pools(pair.prefill, pair.start_pools["prefill"], POOLS_BACK_S), 3)
    startup_s = pair.restart_decode()
    healthy = time.monotonic()
    while post(router + "/generate", small(22), 60)[0] != 200:
        assert time.monotonic() - healthy < RESTART_SERVE_S
        time.sleep(0.2)
    serve_again_s = time.monotonic() - healthy
    back = pools_back(pair)
    record("sigterm_drain_decode", new_request_bound_s=DEAD_D_ANSWER_S, new_request_status=status,
           new_request_failed_after_s=round(refused_s, 3), in_flight_stream_finished_s=round(end.seconds, 3),
           exit_bound_after_stream_s=DRAIN_EXIT_S, exit_code=exit_code, exited_after_s=round(exited - term, 3),
           exited_after_stream_s=round(exited - stream_done, 3),
           prefill_pools_back_s=p_back, decode_startup_s=round(startup_s, 3),
           serve_again_after_healthy_s=round(serve_again_s, 3), pools_back=back)


def test_more_requests_than_decode_runs_at_once(pair):
    """Three times D's --max-running-requests at once: each completes whole or fails with a clear error, D
    stays up, and its pools return to start."""
    router = pair.router.url
    n = 3 * D_MAX_RUNNING
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        bodies = [{"input_ids": ids(400, 30 + i),
                   "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}} for i in range(n)]
        results = [f.result(timeout=110) for f in [pool.submit(post, router + "/generate", b, 100) for b in bodies]]
    seconds = time.monotonic() - started
    statuses = [status for status, _ in results]
    for status, body in results:
        assert (status == 200 and body["meta_info"]["completion_tokens"] == 40) or (status >= 500 and "error" in body)
    assert statuses.count(200) == n  # queueing, not refusals: D admits them as running slots free up
    assert pair.decode.proc.poll() is None
    back = pools_back(pair)
    assert served(router, 40)
    record("decode_over_max_running", concurrent=n, decode_max_running=D_MAX_RUNNING, statuses=statuses,
           all_answered_s=round(seconds, 3), pools_back=back)


def test_killed_decode_mid_transfer(pair):
    """kill -9 D while P computes and ships a 3000-token prefix to it: the client gets an error within
    DEAD_D_ANSWER_S, P's pools come back, and D restarted on its port serves again within RESTART_SERVE_S."""
    router = pair.router.url
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        in_transfer = pool.submit(post, router + "/generate", stream_body(70, n_in=3000, n_out=8), 60)
        deadline = time.monotonic() + 20
        while pools(pair.prefill)["transfer"]["open_rooms"] == 0:  # P took D's handshake: rows are going out
            assert time.monotonic() < deadline and not in_transfer.done(), "the transfer never started"
            time.sleep(0.02)
        time.sleep(0.2)
        open_rooms = pools(pair.decode)["transfer"]["open_rooms"]
        os.kill(pair.decode.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        status, body = in_transfer.result(timeout=DEAD_D_ANSWER_S + 30)
        answered_s = time.monotonic() - killed
    pair.decode.proc.wait(10)
    assert status >= 500 and "error" in body, body
    assert answered_s < DEAD_D_ANSWER_S and open_rooms == 1
    p_back = round(wait_pools(pair.prefill, pair.start_pools["prefill"], POOLS_BACK_S), 3)
    assert health_generate(pair.prefill.url) == 200
    startup_s = pair.restart_decode()
    healthy = time.monotonic()
    while post(router + "/generate", small(90), 60)[0] != 200:
        assert time.monotonic() - healthy < RESTART_SERVE_S, "the restarted D is not served through the router"
        time.sleep(0.2)
    serve_again_s = time.monotonic() - healthy
    back = pools_back(pair)
    record("kill9_decode_mid_transfer", answer_bound_s=DEAD_D_ANSWER_S, status=status,
           error=body["error"].get("message", "")[:160] if isinstance(body.get("error"), dict) else str(body)[:160],
           answered_after_kill_s=round(answered_s, 3), decode_open_rooms_at_kill=open_rooms,
           prefill_pools_back_s=p_back, decode_startup_s=round(startup_s, 3),
           serve_again_after_healthy_s=round(serve_again_s, 3), pools_back=back)

def test_sigterm_drains_prefill(pair):
    """SIGTERM P while it computes a 3000-token prefix: that request is answered whole, a new one fails
    clearly, P exits 0; P restarted on its ports serves again; D's pools are back within its quarantine grace."""
    router = pair.router.url
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(post, router + "/generate", stream_body(80, n_in=3000, n_out=8), 60)
        deadline = time.monotonic() + 20
        while pools(pair.prefill)["transfer"]["open_rooms"] == 0:
            assert time.monotonic() < deadline and not running.done(), "the request never reached P's transfer"
            time.sleep(0.02)
        term = time.monotonic()
        os.kill(pair.prefill.proc.pid, signal.SIGTERM)
        time.sleep(0.2)
        status, body = post(router + "/generate", small(81), 60)
        refused_s = time.monotonic() - term
        run_status, run_body = running.result(timeout=60)
        finished_s = time.monotonic() - term
    exit_code = pair.prefill.proc.wait(DRAIN_EXIT_S)
    exited_s = time.monotonic() - term
    assert status >= 500 and "error" in body and refused_s < DEAD_D_ANSWER_S + 0.2, (status, body)
    assert run_status == 200 and run_body["meta_info"]["completion_tokens"] == 8, run_body
    assert exit_code == 0
    startup_s = pair.restart_prefill()
    healthy = time.monotonic()
    tries = []
    while (answer := post(router + "/generate", small(82), 60))[0] != 200:
        tries.append(answer[0])
        assert time.monotonic() - healthy < RESTART_SERVE_S, ("the restarted P is not served", answer)
        time.sleep(0.2)
    serve_again_s = time.monotonic() - healthy
    # D's room of the request refused meanwhile waits out its quarantine grace (P exited before confirming)
    back = {"prefill_s": round(wait_pools(pair.prefill, pair.start_pools["prefill"], POOLS_BACK_S), 3),
            "decode_s": round(wait_pools(pair.decode, pair.start_pools["decode"], QUARANTINED_BACK_S), 3)}
    record("sigterm_drain_prefill", failed_before_served_again=tries, new_request_bound_s=DEAD_D_ANSWER_S,
           new_request_status=status, new_request_error=str(body.get("error"))[:160],
           new_request_failed_after_s=round(refused_s, 3), in_flight_answered_after_sigterm_s=round(finished_s, 3),
           exit_code=exit_code, exited_after_s=round(exited_s, 3),
           prefill_startup_s=round(startup_s, 3), serve_again_after_healthy_s=round(serve_again_s, 3), pools_back=back)
