"""Faults with real processes behind the real router (sglang-router, tiny checkpoint, 127.0.0.1): a client
that disconnects mid-stream, kill -9 of D mid-stream, kill -9 of P with requests in flight. In each the
client's stream or request ends within a stated bound (never a silent hang), the surviving worker keeps
serving, and its pools (/server_info internal_states: cache pages, transfer slots, extents, rooms,
Mooncake registrations) return exactly to their start values."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
import urllib.request

import pytest

from sglang_asym.testing.server_process import post

from .faults import D_TRANSFER_TIMEOUT_S, first_event, open_stream, pools, read_stream, record, trio, wait_pools

pytestmark = pytest.mark.timeout(240)


def ids(n: int, seed: int) -> list[int]:
    """n deterministic token ids inside the tiny checkpoint's vocabulary (512, above its special ids)."""
    return [(seed * 7919 + i * 104729) % 500 + 3 for i in range(n)]


STREAM = {"input_ids": ids(300, 1), "sampling_params": {"max_new_tokens": 200, "temperature": 0}}
POOLS_BACK_S = 15.0  # a worker's pools are at their start values this long after the fault at most
KILLED_D_STREAM_END_S = 5.0  # the client's stream ends this long after D is killed at most
# P killed: D notices by its heartbeats or, at the latest, its transfer timeout; the router then answers
KILLED_P_ANSWER_S = D_TRANSFER_TIMEOUT_S + 10.0
# D keeps a failed room's landing extent quarantined (a dead P cannot confirm it stopped writing) for
# TransferConfig.quarantine_grace_s (30 s) after it noticed the failure
QUARANTINED_BACK_S = 30.0 + D_TRANSFER_TIMEOUT_S + 10.0


def _health_generate(server) -> int:
    with urllib.request.urlopen(server.url + "/health_generate", timeout=30) as resp:
        return resp.status


def test_client_disconnect_mid_stream_frees_both_workers(tiny_checkpoint, tmp_path):
    with trio(tiny_checkpoint, tmp_path) as t:
        p, d, router = t["prefill"], t["decode"], t["router"]
        p0, d0 = pools(p), pools(d)
        conn, resp = open_stream(router.url, STREAM, timeout_s=60)
        first_event(resp)
        assert pools(d)["num_used_tokens"] > 0  # the request is decoding on D
        conn.close()
        back = {"prefill_s": round(wait_pools(p, p0, POOLS_BACK_S), 3),
                "decode_s": round(wait_pools(d, d0, POOLS_BACK_S), 3)}
        status, body = post(router.url + "/generate", {**STREAM, "sampling_params": {"max_new_tokens": 4}}, 60)
        assert status == 200 and body["meta_info"]["completion_tokens"] == 4
        record("client_disconnect_mid_stream", bound_s=POOLS_BACK_S, pools_back=back)


def test_killed_decode_ends_the_stream_and_prefill_stays_clean(tiny_checkpoint, tmp_path):
    with trio(tiny_checkpoint, tmp_path) as t:
        p, d, router = t["prefill"], t["decode"], t["router"]
        p0 = pools(p)
        started = time.monotonic()
        conn, resp = open_stream(router.url, STREAM, timeout_s=60)
        events = first_event(resp)
        killed = time.monotonic()
        os.kill(d.proc.pid, signal.SIGKILL)
        end = read_stream(resp, killed, events)
        conn.close()
        assert end.seconds < KILLED_D_STREAM_END_S and not end.done and end.error
        assert end.events[-1]["meta_info"]["finish_reason"] is None  # never a fake finish
        assert _health_generate(p) == 200
        record("kill9_decode_mid_stream", bound_s=KILLED_D_STREAM_END_S, stream_end_s=round(end.seconds, 3),
               client_saw=end.error, events_before=len(end.events), killed_after_request_s=round(killed - started, 3),
               prefill_pools_back_s=round(wait_pools(p, p0, POOLS_BACK_S), 3))


def test_killed_prefill_fails_in_flight_requests_and_decode_stays_clean(tiny_checkpoint, tmp_path):
    long_prompt = {"input_ids": ids(3000, 2), "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    with trio(tiny_checkpoint, tmp_path) as t:
        p, d, router = t["prefill"], t["decode"], t["router"]
        d0 = pools(d)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(post, router.url + "/generate", {**long_prompt, "input_ids": ids(3000, 2 + i)}, 120)
                       for i in range(4)]
            time.sleep(0.5)  # P computes the first prefix, the others wait behind it
            killed = time.monotonic()
            os.kill(p.proc.pid, signal.SIGKILL)
            results = [f.result(timeout=KILLED_P_ANSWER_S + 30) for f in futures]
            answered = time.monotonic() - killed
        statuses = sorted(status for status, _ in results)
        assert answered < KILLED_P_ANSWER_S
        assert all(status >= 500 or body["meta_info"]["completion_tokens"] == 8 for status, body in results)
        assert any(status >= 500 for status in statuses)  # the requests P had not finished failed clearly
        assert _health_generate(d) == 200  # D serves while the failed rooms' extents sit in quarantine
        record("kill9_prefill_4_in_flight", bound_s=KILLED_P_ANSWER_S, statuses=statuses,
               all_answered_s=round(answered, 3), decode_pools_bound_s=QUARANTINED_BACK_S,
               decode_pools_back_s=round(wait_pools(d, d0, QUARANTINED_BACK_S), 3))
