"""`--asym-transfer-fallback recompute` on SGLang's own engine on CPU: `python -m sglang.launch_server --device
cpu --disaggregation-mode asym-decode --asym-transfer-fallback recompute` computes the prompt itself when
its handshake with P or the prefix transfer fails, and answers exactly what the pair answers through
sglang-router when nothing fails (on the nine-layer tiny checkpoint: the fallback's path, not the 40-layer
schedule, is the subject):
- P unreachable (nothing listens at the bootstrap port): SGLang's handshake fails in D's prealloc queue,
  for a prompt above the window (D computes [0, B) then the window) and one within it;
- P reachable but never given the room: D's pages are allocated and its transfer times out in the
  transfer queue after D's waiting timeout (SGLang holds those pages for a deferred release; the
  recompute gets fresh ones).
Each fallback is one WARNING line and one count on D's /metrics; SGLang's own used-token counters
return to 0 on both workers and the pair serves the next request. The client-side time of each
request, with and without the fallback, goes to reliability.json (`engine_transfer_fallback_recompute`).
"""

from __future__ import annotations

import concurrent.futures
import re
import time

import pytest

from harness.router_launch import RouterFlavor, pick_free_port
from harness.server_process import post

from . import faults
from .faults import abort
from .helpers import serving
from .sglang_servers import metric_sum, patient_router, prompt_of, restore, settle, sglang_server, sglang_workspace

pytestmark = pytest.mark.timeout(1200)

WINDOW = 128
NEW = 12
# D's wait for P's rows (SGLang's default is 300 s): above P's compute time of every prompt here on a slow
# host, since a normal request whose rows come later fails too (and P's error reaches the client)
WAITING_TIMEOUT_S = 40  # on a slow host P's 2,872-row prefix (P_ABORTED_N) took over 20 s
# the prompt aborted on P, in one forward of seconds even on a fast host: the aborts go out every 0.5 s from the
# request's start, so one lands while P holds the room (in its bootstrap queue or its forward), never after D has
# the rows. (Waiting for P's used-token gauge first timed out on the slowest CI host: SGLang sets it only after the
# forward, which took over 60 s there.) A forward must end inside D's WAITING_TIMEOUT_S.
P_ABORTED_N = 3000
FALLBACK_COUNTER = "sglang_asym:transfer_fallback_recompute_total"
FALLBACK_LINE = "recomputing its"
PREFIX_LINE = re.compile(r"recomputed its (\d+)-token prefix on this decode worker in ([\d.]+) s")
HANDSHAKE_FAILED = "Decode handshake failed"  # SGLang's error line when a room's handshake fails on D
HANDSHAKE_FAILED_WITHIN_S = 60.0  # D reports a failed handshake this long after the abort at most
BOOTSTRAP_FETCH_FAILED = "Error fetching prefill server info from bootstrap"  # SGLang's line per failed try on D


@pytest.fixture(scope="module")
def pair(sglang_tiny_checkpoint, tmp_path_factory):
    checkpoint = sglang_tiny_checkpoint
    work, logs = sglang_workspace(tmp_path_factory, "sglang_fallback")
    # P computes each prefix in one forward, as the fallback does (the reference model is not chunk-invariant
    # bit for bit)
    servers = {
        "prefill": sglang_server("asym-prefill", checkpoint, logs, "--chunked-prefill-size", "4096"),
        "decode": sglang_server("asym-decode", checkpoint, logs, "--asym-transfer-fallback", "recompute",
                                env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(WAITING_TIMEOUT_S)}),
    }
    with serving(servers, timeout_s=600):
        # one sglang-router for both cases (its own start costs seconds of CPU)
        with patient_router(servers["prefill"], servers["decode"], RouterFlavor.SGLANG_ROUTER) as router:
            servers["router"] = router
            yield servers


@pytest.fixture(autouse=True)
def _shared_servers_back_to_empty(pair):
    """After each case: the module's servers healthy with empty pools, or restarted and the case failed."""
    yield
    restore(pair)


def _generate(url: str, prompt: list[int], **routing) -> tuple[list[int], float]:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True},
            **routing}
    started = time.monotonic()
    status, answer = post(url + "/generate", body, timeout_s=300)
    assert status == 200, answer
    return answer["output_ids"], time.monotonic() - started


def _logged(server, marker: str, words: str) -> bool:
    """Whether a line of the server's log holds `marker` and names `words`."""
    return any(marker in line and words in line for line in server.log.read_text(errors="replace").splitlines())


def _wait_for_log(server, words: str, timeout_s: float, marker: str = HANDSHAKE_FAILED) -> None:
    """Until a `marker` line of the server's log names `words`."""
    deadline = time.monotonic() + timeout_s
    while not _logged(server, marker, words):
        assert time.monotonic() < deadline, f"no {marker!r} line with {words!r} after {timeout_s} s"
        time.sleep(0.2)


def test_a_failed_handshake_or_transfer_is_recomputed_on_d_and_equals_the_pair(pair):
    """One failure at a time: two recomputes on D at once would share its forwards, and this pair (not in
    deterministic mode) may then give other greedy tokens than each alone (seen once at N = 100's eleventh
    token when the three were sent together)."""
    prefill, decode = pair["prefill"], pair["decode"]
    assert (metric_sum(decode, FALLBACK_COUNTER) or 0.0) == 0.0
    cases = [("P unreachable", 300, pick_free_port()), ("P unreachable", 100, pick_free_port()),
             ("P never given the room", 400, prefill.bootstrap_port)]
    facts = []
    router = pair["router"]
    for i, (what, n, bootstrap_port) in enumerate(cases):
        prompt = prompt_of(n)
        expected, pair_s = _generate(router.url, prompt)
        assert len(expected) == NEW
        routing = {"bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port, "bootstrap_room": 7000 + i}
        got, fallback_s = _generate(decode.url, prompt, **routing)
        assert got == expected, (what, n)
        assert metric_sum(decode, FALLBACK_COUNTER) == float(i + 1)
        facts.append({"failure": what, "prompt_tokens": n, "boundary": max(n - WINDOW, 0),
                      "pair_s": round(pair_s, 2), "fallback_s": round(fallback_s, 2)})
    log = decode.log.read_text(errors="replace")
    assert log.count(FALLBACK_LINE) == len(cases)
    computed = [(int(b), float(s)) for b, s in PREFIX_LINE.findall(log)]
    assert [b for b, _ in computed] == [f["boundary"] for f in facts if f["boundary"]]
    for fact, (_, seconds) in zip([f for f in facts if f["boundary"]], computed):
        fact["prefix_compute_s"] = seconds
    assert settle([prefill, decode], 120) == [0, 0]
    assert len(_generate(router.url, prompt_of(200))[0]) == NEW  # the pair serves on
    faults.record("engine_transfer_fallback_recompute", requests=facts, outputs_equal_the_pair=True,
                  waiting_timeout_s=WAITING_TIMEOUT_S, used_tokens_back=True)


def test_a_request_its_client_aborts_is_not_recomputed(pair):
    """An abort that reaches D while its handshake is failing, or P alone while P holds the room (P passes the
    abort on to D, room_lifecycle.py), ends the request; D does not recompute it."""
    prefill, decode = pair["prefill"], pair["decode"]
    before = metric_sum(decode, FALLBACK_COUNTER) or 0.0
    unreachable = {"bootstrap_host": "127.0.0.1", "bootstrap_port": pick_free_port(), "bootstrap_room": 7100}
    for where, url, worker, routing, n in (("D", decode.url, decode, unreachable, 300),
                                           ("P", pair["router"].url, prefill, {}, P_ABORTED_N)):
        rid = f"fallback-abort-{where}-{time.monotonic_ns()}"
        body = {"input_ids": prompt_of(n), "rid": rid, **routing,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(post, url + "/generate", body, 120)
            if where == "D":  # inside SGLang's 15 s of handshake retries: it logs each failed fetch with the port
                _wait_for_log(decode, f"port={routing['bootstrap_port']}", 60, BOOTSTRAP_FETCH_FAILED)
            # again until answered: an abort that reaches the worker before the request (the router's
            # dispatch is late on a loaded host) is dropped, and P computes this prefix for seconds
            while not answer.done():
                assert abort(worker.url, rid) == 200
                concurrent.futures.wait([answer], timeout=0.5)
            status, result = answer.result(timeout=60)
        assert status != 200 or result["meta_info"]["finish_reason"]["type"] == "abort", (where, status, result)
    # the failure SGLang's receiver then reports for D's aborted room (at once, or after its handshake
    # retries) has passed D's fallback hook: it must not have been recomputed
    _wait_for_log(decode, f"bootstrap_room={unreachable['bootstrap_room']}", HANDSHAKE_FAILED_WITHIN_S)
    assert (metric_sum(decode, FALLBACK_COUNTER) or 0.0) == before
    assert settle([prefill, decode], 120) == [0, 0]
