"""Faults against the asymmetric pair inside SGLang 0.5.23's own engine (`python -m sglang.launch_server
--device cpu --disaggregation-mode asym-prefill | asym-decode`, the nine-layer tiny checkpoint: the faults are
about the serving path, not the 40-layer schedule) behind sglang-router
with per-worker health checks (router_launch.WorkerHealth): client disconnects, aborts, killed and frozen
workers, drains and more requests than D runs at once, on one shared pair whose killed workers restart on
their ports.

SGLang's own transfer deadlines are shortened for the stack (FAULT_ENV): P waits BOOTSTRAP_TIMEOUT_S for
D's handshake, D waits WAITING_TIMEOUT_S for P's rows, D probes P's bootstrap server every second.
In each scenario the client gets an HTTP error status, an SSE error event, an abort finish, or its whole
answer within the bound stated; the surviving worker keeps serving; SGLang's own used-token counters of
both workers return to 0; the next request through the router is served. Measured times go to
$SGLANG_ASYM_RELIABILITY_OUT (faults.record).

A kill or a freeze strikes a worker's whole process group (SGLang's launcher with the HTTP server and
bootstrap server, its scheduler and detokenizer: a machine that dies or stalls); SIGTERM goes to the
launcher, as a service manager sends it. Long prompts are P_CHUNK-token chunks on P, so a fault can strike
between two chunks P has shipped ("mid-transfer")."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from harness.router_launch import RouterFlavor, RouterProcess, WorkerHealth
from harness.server_process import ServerProcess, post, wait_healthy
from harness.sglang_shapes import sglang_tiny
from sglang_asym.split import SplitPlan

from . import faults
from .faults import abort, first_event, health_generate, open_stream, read_stream, send_stream, wait_draining
from .helpers import group_gone, serving, stop_all
from .sglang_servers import broken, metric_sum, patient_router, prompt_of, settle, sglang_server, wait_computing

pytestmark = pytest.mark.timeout(600)

# the router in front: sglang-router in the suite; SGLANG_ASYM_FAULT_ROUTER=smg runs every scenario behind smg
# (recorded under the scenario's name with "_smg" appended)
ROUTER = RouterFlavor(os.environ.get("SGLANG_ASYM_FAULT_ROUTER", RouterFlavor.SGLANG_ROUTER.value))

BOOTSTRAP_TIMEOUT_S = 10
# D's wait covers P's whole prefix (IN_TRANSFER_N: 6 chunks, about 2 s on an idle host) and its transfer, with room
# for a loaded 2-core CI host (a healthy P that outlasts it fails the request before P shipped a byte)
WAITING_TIMEOUT_S = 20
FAULT_ENV = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": str(BOOTSTRAP_TIMEOUT_S),
             "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(WAITING_TIMEOUT_S),
             "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "1", "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2"}
# SGLang's /health runs a request through the scheduler: on 2 shared cores it can take seconds while a prompt
# computes, so a check gets 30 s; a killed worker refuses the connection at once and is out after 2 checks
HEALTH = WorkerHealth(interval_s=1, timeout_s=30, failure_threshold=2, success_threshold=1)
FLAGS = ("--asym-semantics", "asym-exact-encoder")
SETTLE_S = 60.0  # used tokens back at 0 this long after the fault ends at most
ABORT_END_S = 10.0  # an aborted stream ends this long after /abort_request at most
STREAM_END_S = 10.0  # a stream whose D was killed ends this long after the kill at most
DEAD_ANSWER_S = BOOTSTRAP_TIMEOUT_S + 10.0  # a request while a worker is dead is answered with an error by then
RESTART_SERVE_S = 10.0  # from a restarted worker healthy to sending the first request served through the router
FROZEN_S = BOOTSTRAP_TIMEOUT_S + 3.0  # how long D stays stopped: past P's wait for its handshake
THAWED_ANSWER_S = 10.0  # after SIGCONT, the request sent while D was frozen is answered (an error) by then
DRAIN_EXIT_S = 30.0  # D exits this long after SIGTERM at most (its running stream finishes first)
D_MAX_RUNNING = 2  # D runs this many requests at once; more wait in its queue
P_CHUNK = 256  # P computes and ships a long prefix in chunks of this many tokens: "mid-transfer" is between two
# a prompt P is still computing and shipping when a fault strikes (6 chunks of its 1372-token prefix: the tiny model
# computes a chunk in about a third of a second, so a fault struck after the first chunk's bytes finds P at work)
IN_TRANSFER_N = 1500
EARLY_GONE_N = 3000  # a prompt whose first token comes after about 4.5 s on an idle host (P's prefix most of it)
WINDOW = 128
PAYLOAD_BYTES = "sglang_asym:kv_transfer_payload_bytes_total"  # P's exact-payload counter (exact_payload.py)
FROZEN_P_S = WAITING_TIMEOUT_S + 3.0  # how long P stays stopped: past D's wait for its rows
FROZEN_ANSWER_S = 10.0  # requests stuck on a frozen P are answered (an error) this long after the freeze at most:
# D's heartbeat to P's bootstrap server fails twice at 1 s intervals and D fails the rooms waiting on P
DRAIN_P_EXIT_S = 60.0  # P exits this long after SIGTERM at most (its running prefix is computed and shipped first)


class EnginePair:
    """The two SGLang servers; a killed worker restarts on its own ports (the router's configuration holds)."""

    def __init__(self, checkpoint: Path, logs: Path) -> None:
        self.checkpoint, self.logs = checkpoint, logs
        self.prefill = self._start("asym-prefill")
        self.decode = self._start("asym-decode")
        self.router: RouterProcess | None = None

    def _start(self, mode: str, old: ServerProcess | None = None) -> ServerProcess:
        extra = (("--max-running-requests", str(D_MAX_RUNNING)) if mode == "asym-decode"
                 else ("--chunked-prefill-size", str(P_CHUNK)))
        return sglang_server(mode, self.checkpoint, self.logs, *FLAGS, *extra, env=FAULT_ENV, port=old and old.port,
                             bootstrap_port=old and old.bootstrap_port)

    def restart(self, role: str) -> float:
        """Start a stopped worker again on its ports; seconds until it is healthy."""
        old = getattr(self, role)
        assert old.proc.poll() is not None, f"restart needs the {role} stopped first"
        started = time.monotonic()
        setattr(self, role, self._start(old.mode, old))
        wait_healthy(getattr(self, role), 300)
        return time.monotonic() - started


@pytest.fixture(scope="module")
def engine(sglang_tiny_checkpoint, tmp_path_factory) -> Iterator[EnginePair]:
    pair = EnginePair(sglang_tiny_checkpoint, tmp_path_factory.mktemp("sglang_faults"))
    first = {"prefill": pair.prefill, "decode": pair.decode}
    with serving(first, timeout_s=300):
        pair.prefill, pair.decode = first["prefill"], first["decode"]  # serving() may have moved one to fresh ports
        with patient_router(pair.prefill, pair.decode, ROUTER, HEALTH, pair.logs / "router.log") as router:
            pair.router = router
            warm_gauges(pair)
            assert settle([pair.prefill, pair.decode], SETTLE_S) == [0, 0]
            try:
                yield pair
            finally:
                stop_all([pair.prefill, pair.decode])  # the restarted ones (serving() stops the first two)


@pytest.fixture(autouse=True)
def _pair_back_after_each_case(engine, request):
    """A case that left a worker dead or unhealthy, or the pools not empty, fails here, and the next case
    gets the pair restarted on its ports (the router's configuration holds)."""
    yield
    if request.node.get_closest_marker("leaves_servers_stopped"):
        return
    problems = broken({"prefill": engine.prefill, "decode": engine.decode})
    if not problems:
        return
    stop_all([engine.prefill, engine.decode])
    for role in ("prefill", "decode"):
        engine.restart(role)
    warm_gauges(engine)
    raise AssertionError(f"the case left the pair broken (restarted): {problems}")


def record(scenario: str, **facts) -> None:
    suffix = "" if ROUTER is RouterFlavor.SGLANG_ROUTER else f"_{ROUTER.value}"
    faults.record(scenario + suffix, router=ROUTER.value, **facts)


def warm_gauges(engine: EnginePair) -> None:
    """SGLang publishes a fresh D's used-token gauge with its first decode stats (every 40 decode steps)."""
    status, body = post(engine.router.url + "/generate", {"input_ids": prompt_of(150), "sampling_params": {
        "max_new_tokens": 48, "temperature": 0, "ignore_eos": True}}, 300)
    assert status == 200, body


def stream_body(n_in: int, n_out: int, tag: str) -> dict:
    return {"input_ids": prompt_of(n_in), "rid": f"{tag}-{time.monotonic_ns()}",
            "sampling_params": {"max_new_tokens": n_out, "temperature": 0, "ignore_eos": True}}


def small(n: int) -> dict:
    return {"input_ids": prompt_of(n), "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}


def served(engine: EnginePair, n: int = 200) -> bool:
    status, body = post(engine.router.url + "/generate", small(n), 120)
    return status == 200 and body["meta_info"]["completion_tokens"] == 4


def answers_while_dead(engine: EnginePair, lengths: tuple[int, ...]) -> list[tuple[int, float]]:
    """(status, seconds) of requests sent one after another while a worker is dead: each an HTTP error."""
    answers = []
    for n in lengths:
        sent = time.monotonic()
        status, body = post(engine.router.url + "/generate", small(n), 120)
        answers.append((status, round(time.monotonic() - sent, 3)))
        assert status >= 500 and "error" in str(body), (status, body)
    assert max(seconds for _, seconds in answers) < DEAD_ANSWER_S, answers
    return answers


def timed_post(url: str, body: dict, timeout_s: float) -> tuple[int, dict, float]:
    """post() that also says when the answer came (time.monotonic())."""
    status, answer = post(url, body, timeout_s)
    return status, answer, time.monotonic()


def payload_bytes(prefill: ServerProcess) -> float:
    return metric_sum(prefill, PAYLOAD_BYTES) or 0.0


def wait_mid_transfer(engine: EnginePair, shipped_before: float, request: concurrent.futures.Future) -> float:
    """Wait until P has written part of a long prompt's rows into D's pool (its payload counter moved) while
    the request is still open; the bytes shipped so far, fewer than the request's whole manifest."""
    whole = SplitPlan(sglang_tiny(), IN_TRANSFER_N, WINDOW, FLAGS[1]).manifest("release").total_bytes
    deadline = time.monotonic() + 120
    while (shipped := payload_bytes(engine.prefill) - shipped_before) == 0:
        assert time.monotonic() < deadline and not request.done(), \
            f"P shipped nothing of the long prompt: {request.result() if request.done() else 'unanswered'}"
        time.sleep(0.05)
    assert 0 < shipped < whole and not request.done(), (shipped, whole)
    return shipped


def settled(engine: EnginePair) -> float:
    """Seconds until both workers' used tokens are 0 (AssertionError naming them after SETTLE_S)."""
    started = time.monotonic()
    used = settle([engine.prefill, engine.decode], SETTLE_S)
    assert used == [0, 0], f"used tokens (P, D) still {used} after {SETTLE_S} s"
    return round(time.monotonic() - started, 3)


def serves_again(engine: EnginePair) -> float:
    """Seconds from the restarted worker healthy to sending the first request the router gets served (its
    own compute, seconds on two shared cores, is not counted)."""
    healthy = time.monotonic()
    while True:
        sent = time.monotonic()
        if served(engine):
            break
        assert time.monotonic() - healthy < RESTART_SERVE_S, "the restarted worker is not served through the router"
        time.sleep(0.3)
    again_s = round(sent - healthy, 3)
    warm_gauges(engine)
    return again_s


def test_client_disconnect_mid_stream_frees_both_workers(engine):
    conn, resp = open_stream(engine.router.url, stream_body(300, 200, "gone"), 120)
    first_event(resp)
    conn.close()
    back_s = settled(engine)
    assert served(engine)
    record("engine_client_disconnect_mid_stream", bound_s=SETTLE_S, used_tokens_zero_after_s=back_s)


def test_abort_request_on_both_workers_ends_the_stream(engine):
    body = stream_body(300, 200, "abort")
    conn, resp = open_stream(engine.router.url, body, 120)
    events = first_event(resp)
    sent = time.monotonic()
    assert abort(engine.decode.url, body["rid"]) == 200 and abort(engine.prefill.url, body["rid"]) == 200
    end = read_stream(resp, sent, events)
    conn.close()
    last = end.events[-1]["meta_info"]
    assert end.seconds < ABORT_END_S and last["finish_reason"]["type"] == "abort", (end.error, last)
    assert 0 < last["completion_tokens"] < 200
    back_s = settled(engine)
    assert served(engine)
    record("engine_abort_request_mid_stream", bound_s=ABORT_END_S, stream_end_after_abort_s=round(end.seconds, 3),
           tokens_before_abort=last["completion_tokens"], used_tokens_zero_after_s=back_s)


def test_killed_decode_mid_stream_and_mid_transfer_then_restarted_on_its_port(engine):
    """kill -9 D with one stream decoding on it and a long prompt whose rows P is part way through writing
    into D's pool: the stream ends with an error, the long request gets an HTTP error, P stays healthy and
    frees everything; D restarted on its port serves again."""
    conn, resp = open_stream(engine.router.url, stream_body(300, 200, "kill-d"), 120)
    events = first_event(resp)
    shipped_before = payload_bytes(engine.prefill)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        in_transfer = pool.submit(timed_post, engine.router.url + "/generate", small(IN_TRANSFER_N), 120)
        shipped = wait_mid_transfer(engine, shipped_before, in_transfer)
        killed = time.monotonic()
        os.killpg(engine.decode.proc.pid, signal.SIGKILL)
        end = read_stream(resp, killed, events)
        conn.close()
        status, body, answered = in_transfer.result(timeout=DEAD_ANSWER_S + 30)
    engine.decode.proc.wait(10)
    # an error, never a fake finish: sglang-router closes the stream without [DONE], smg sends an SSE error
    # event and then [DONE]
    assert end.error and end.seconds < STREAM_END_S, end
    assert all(e.get("meta_info", {}).get("finish_reason") is None for e in end.events), end
    assert status >= 500 and "error" in str(body) and answered - killed < DEAD_ANSWER_S, (status, body)
    dead = answers_while_dead(engine, (200, 201))
    assert health_generate(engine.prefill.url) == 200
    p_back = settle([engine.prefill], SETTLE_S)
    assert p_back == [0], p_back
    startup_s = engine.restart("decode")
    again_s = serves_again(engine)
    back_s = settled(engine)
    record("engine_kill9_decode_mid_stream_and_mid_transfer_then_restart", stream_end_bound_s=STREAM_END_S,
           stream_end_s=round(end.seconds, 3), stream_error=str(end.error)[:160], in_transfer_prompt_tokens=IN_TRANSFER_N,
           in_transfer_bytes_shipped_at_kill=int(shipped), in_transfer_status=status,
           in_transfer_error=str(body)[:200], in_transfer_answered_after_kill_s=round(answered - killed, 3),
           dead_bound_s=DEAD_ANSWER_S, requests_while_dead=dead,
           decode_startup_s=round(startup_s, 3), serve_again_bound_after_healthy_s=RESTART_SERVE_S,
           serve_again_after_healthy_s=again_s, used_tokens_zero_after_s=back_s)


def test_killed_prefill_with_requests_in_flight_then_restarted_on_its_ports(engine):
    """kill -9 P with a stream decoding on D (P's part done) and two long prompts P is computing and
    shipping: the stream finishes whole on D, the two get HTTP errors, D stays healthy and frees their
    slots; P restarted on its ports serves again."""
    conn, resp = open_stream(engine.router.url, stream_body(300, 60, "kill-p"), 120)
    events = first_event(resp)
    shipped_before = payload_bytes(engine.prefill)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        in_flight = [pool.submit(timed_post, engine.router.url + "/generate", small(IN_TRANSFER_N + i), 120)
                     for i in range(2)]
        wait_mid_transfer(engine, shipped_before, in_flight[0])
        killed = time.monotonic()
        os.killpg(engine.prefill.proc.pid, signal.SIGKILL)
        answers = [f.result(timeout=DEAD_ANSWER_S + 30) for f in in_flight]
    engine.prefill.proc.wait(10)
    for status, body, answered in answers:
        assert status >= 500 and "error" in str(body) and answered - killed < DEAD_ANSWER_S, (status, body)
    dead = answers_while_dead(engine, (202, 203))
    end = read_stream(resp, killed, events)
    conn.close()
    assert end.done and end.error is None and end.events[-1]["meta_info"]["completion_tokens"] == 60, end
    assert health_generate(engine.decode.url) == 200
    d_back = settle([engine.decode], SETTLE_S)
    assert d_back == [0], d_back
    startup_s = engine.restart("prefill")
    again_s = serves_again(engine)
    back_s = settled(engine)
    record("engine_kill9_prefill_with_requests_in_flight_then_restart",
           stream_on_decode_finished_s=round(end.seconds, 3), in_flight_bound_s=DEAD_ANSWER_S,
           in_flight=[{"status": status, "error": str(body)[:160], "answered_after_kill_s": round(t - killed, 3)}
                      for status, body, t in answers],
           dead_bound_s=DEAD_ANSWER_S, requests_while_dead=dead, prefill_startup_s=round(startup_s, 3),
           serve_again_bound_after_healthy_s=RESTART_SERVE_S, serve_again_after_healthy_s=again_s,
           used_tokens_zero_after_s=back_s)


def test_frozen_prefill_past_the_transfer_timeout(engine):
    """SIGSTOP P part way through shipping a long prompt, with a second request arriving, for longer than D
    waits for P's rows, then SIGCONT: D keeps serving meanwhile, both requests end with an HTTP error, the
    resumed P gives its rooms up, both workers' used tokens return to 0 and the next request is served."""
    shipped_before = payload_bytes(engine.prefill)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        long_one = pool.submit(timed_post, engine.router.url + "/generate", small(IN_TRANSFER_N), 120)
        wait_mid_transfer(engine, shipped_before, long_one)
        os.killpg(engine.prefill.proc.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            arriving = pool.submit(timed_post, engine.router.url + "/generate", small(206), 120)
            assert health_generate(engine.decode.url) == 200  # D serves while P is frozen
            time.sleep(max(0.0, FROZEN_P_S - (time.monotonic() - frozen)))
        finally:
            os.killpg(engine.prefill.proc.pid, signal.SIGCONT)
        thawed = time.monotonic()
        answers = [f.result(timeout=THAWED_ANSWER_S + 60) for f in (long_one, arriving)]
    for status, body, answered in answers:
        assert status >= 500 and "error" in str(body), (status, body)
        assert answered - thawed < THAWED_ANSWER_S, (answered - thawed, status, body)
    back_s = settled(engine)
    assert served(engine)
    record("engine_sigstop_prefill_past_transfer_timeout", frozen_s=FROZEN_P_S, waiting_timeout_s=WAITING_TIMEOUT_S,
           bound_after_sigcont_s=THAWED_ANSWER_S,
           requests=[{"status": status, "error": str(body)[:160], "answered_after_freeze_s": round(t - frozen, 3),
                      "answered_after_sigcont_s": round(t - thawed, 3)} for status, body, t in answers],
           used_tokens_zero_after_s=back_s)


def test_sigterm_drains_prefill(engine):
    """SIGTERM P part way through shipping a long prompt: that request is answered whole (or with a clear
    error if SGLang forces the exit, drain.py), a new request fails clearly, P exits; P restarted on its
    ports serves again."""
    shipped_before = payload_bytes(engine.prefill)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(timed_post, engine.router.url + "/generate", small(IN_TRANSFER_N), 300)
        wait_mid_transfer(engine, shipped_before, running)
        term = time.monotonic()
        os.kill(engine.prefill.proc.pid, signal.SIGTERM)
        wait_draining(engine.prefill.url)
        status, body = post(engine.router.url + "/generate", small(207), 120)
        refused_s = time.monotonic() - term
        run_status, run_body, run_answered = running.result(timeout=DRAIN_P_EXIT_S + 60)
    exit_code = engine.prefill.proc.wait(DRAIN_P_EXIT_S)
    exited_s = time.monotonic() - term
    assert status >= 500 and "error" in str(body) and refused_s < DEAD_ANSWER_S, (status, body)
    # drained: answered whole. Or, when SGLang counted P unhealthy at the SIGTERM (a health request unanswered
    # for 20 s while P computes the prompt's chunks on 2 shared cores), forced out: a 503 that says so
    whole = run_status == 200 and run_body["meta_info"]["completion_tokens"] == 4
    forced = run_status >= 500 and "error" in str(run_body)
    assert whole or forced, (run_status, run_body)
    d_back = settle([engine.decode], SETTLE_S)
    assert d_back == [0], d_back
    startup_s = engine.restart("prefill")
    again_s = serves_again(engine)
    back_s = settled(engine)
    record("engine_sigterm_drain_prefill", new_request_status=status, new_request_error=str(body)[:200],
           new_request_failed_after_s=round(refused_s, 3), in_flight_answered_after_s=round(run_answered - term, 3),
           in_flight_outcome="drained, answered whole" if whole else f"forced exit: {run_status} {str(run_body)[:160]}",
           exit_code=exit_code, exited_after_s=round(exited_s, 3), prefill_startup_s=round(startup_s, 3),
           serve_again_after_healthy_s=again_s, used_tokens_zero_after_s=back_s)


def test_clients_gone_before_the_first_token_free_both_workers(engine):
    """Clients that disconnect while P computes the prefix, while it ships, and while D runs the window."""
    backs = {}
    for delay in (0.3, 1.5, 4.0):
        conn = send_stream(engine.router.url, stream_body(EARLY_GONE_N, 50, "early"))
        time.sleep(delay)
        conn.close()
        backs[str(delay)] = settled(engine)
    assert served(engine)
    record("engine_client_disconnect_before_first_token", bound_s=SETTLE_S, disconnect_after_s=[0.3, 1.5, 4.0],
           used_tokens_zero_after_s=backs)


def test_frozen_decode_past_the_transfer_timeout(engine):
    """SIGSTOP D with a stream decoding on it while a new request arrives, past P's wait for D's handshake,
    then SIGCONT: P stays healthy meanwhile, the new request fails clearly, the running stream finishes."""
    conn, resp = open_stream(engine.router.url, stream_body(300, 60, "frozen-d"), 120)
    events = first_event(resp)
    os.killpg(engine.decode.proc.pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            arriving = pool.submit(post, engine.router.url + "/generate", small(204), 120)
            assert health_generate(engine.prefill.url) == 200  # P serves while D is frozen
            time.sleep(max(0.0, FROZEN_S - (time.monotonic() - frozen)))
            os.killpg(engine.decode.proc.pid, signal.SIGCONT)
            thawed = time.monotonic()
            status, body = arriving.result(timeout=THAWED_ANSWER_S + 30)
            answered_after_thaw = time.monotonic() - thawed
    finally:
        os.killpg(engine.decode.proc.pid, signal.SIGCONT)
    end = read_stream(resp, thawed, events)
    conn.close()
    assert status >= 500 and "error" in str(body), (status, body)
    assert answered_after_thaw < THAWED_ANSWER_S
    assert end.done and end.error is None and end.events[-1]["meta_info"]["completion_tokens"] == 60, end
    back_s = settled(engine)
    assert served(engine)
    record("engine_sigstop_decode_past_transfer_timeout", frozen_s=FROZEN_S, bootstrap_timeout_s=BOOTSTRAP_TIMEOUT_S,
           bound_after_sigcont_s=THAWED_ANSWER_S, new_request_status=status,
           new_request_error=str(body)[:200], new_request_answered_after_sigcont_s=round(answered_after_thaw, 3),
           running_stream_finished_after_sigcont_s=round(end.seconds, 3), used_tokens_zero_after_s=back_s)


def test_more_requests_than_decode_runs_at_once(engine):
    """Three times D's --max-running-requests at once: each completes whole (D queues them), D stays up.
    The prompts are just over W, so P computes a few prefix tokens each: with 300-token prompts, P's six
    prefixes on a loaded 2-core box outlasted this module's shortened PD waits (P's 10 s bootstrap wait, D's
    20 s transfer wait) and SGLang failed the transfers, which is the wait's job, not this test's subject."""
    n = 3 * D_MAX_RUNNING
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(post, engine.router.url + "/generate", {
            "input_ids": prompt_of(WINDOW + 1 + i), "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                                        "ignore_eos": True}}, 300)
                   for i in range(n)]
        results = [f.result(timeout=320) for f in futures]
    answers = [(status, body.get("meta_info", {}).get("completion_tokens", body)) for status, body in results]
    assert answers == [(200, 24)] * n, answers
    assert engine.decode.proc.poll() is None
    back_s = settled(engine)
    record("engine_decode_over_max_running", concurrent=n, decode_max_running=D_MAX_RUNNING,
           all_answered_s=round(time.monotonic() - started, 3), used_tokens_zero_after_s=back_s)


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_abort_on_one_worker_mid_transfer_fails_the_request_and_frees_both(engine, side):
    """/abort_request on P alone, or on D alone, while P computes a 2872-token prefix for D: the worker
    that was not told learns it from the other (D's abort notification to P; P's Failed status to D,
    room_lifecycle.py: SGLang would leave D waiting its whole waiting timeout), the client gets an error or
    an abort finish within ABORT_END_S, both workers' used tokens return to 0, and the next request is
    served."""
    body = stream_body(EARLY_GONE_N, 20, f"abort-{side}")
    conn = send_stream(engine.router.url, body)
    wait_computing(engine.prefill)  # D holds the room's slots and waits for the rows
    sent = time.monotonic()
    assert abort(getattr(engine, side).url, body["rid"]) == 200
    end = read_stream(conn.getresponse(), sent)
    conn.close()
    reasons = [e["meta_info"]["finish_reason"] for e in end.events if "meta_info" in e]
    assert end.error is not None or end.status != 200 or (reasons and reasons[-1]["type"] == "abort"), end
    assert end.seconds < ABORT_END_S, end
    back_s = settled(engine)
    assert served(engine)
    record(f"engine_abort_on_{side}_only_mid_transfer", bound_s=ABORT_END_S,
           answered_after_abort_s=round(end.seconds, 3), http_status=end.status, error=(end.error or "")[:200],
           finish=reasons[-1] if reasons else None, used_tokens_zero_after_s=back_s)


@pytest.mark.leaves_servers_stopped  # D stays down: the module's last case (file order)
def test_sigterm_drains_decode(engine):
    """SIGTERM D with a stream decoding on it: that stream finishes whole, a new request fails clearly, D
    exits. The module's last case (this file's order): D stays down, and the module's teardown stops P (the
    kill case shows D restarted on its port serving again; one more restart here would only cost a start)."""
    conn, resp = open_stream(engine.router.url, stream_body(300, 80, "term-d"), 120)
    events = first_event(resp)
    term = time.monotonic()
    os.kill(engine.decode.proc.pid, signal.SIGTERM)
    wait_draining(engine.decode.url)
    status, body = post(engine.router.url + "/generate", small(205), 120)
    refused_s = time.monotonic() - term
    end = read_stream(resp, term, events)
    conn.close()
    exit_code = engine.decode.proc.wait(DRAIN_EXIT_S)
    exited_s = time.monotonic() - term
    group_gone(engine.decode.proc.pid)  # its scheduler and detokenizer too: nothing of D outlives the drain
    assert status >= 500 and "error" in str(body) and refused_s < DEAD_ANSWER_S, (status, body)
    assert end.done and end.error is None and end.events[-1]["meta_info"]["completion_tokens"] == 80, end
    p_back = settle([engine.prefill], SETTLE_S)
    assert p_back == [0], p_back
    assert health_generate(engine.prefill.url) == 200  # P serves on without its D
    record("engine_sigterm_drain_decode", new_request_status=status, new_request_error=str(body)[:200],
           new_request_failed_after_s=round(refused_s, 3), in_flight_stream_finished_s=round(end.seconds, 3),
           exit_code=exit_code, exited_after_s=round(exited_s, 3), used_tokens_zero_after_s=p_back[0])

