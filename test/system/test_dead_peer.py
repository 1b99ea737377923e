"""A dead worker must not take its healthy peer out of the router's rotation.

Both routers' circuit breakers record one outcome per PD request, the status the client got, on both
workers of the pair (pinned below for each flavor): no answer P gives can keep a dead D's failures off
P's count. So the stacks here run the routers with `WorkerHealth`: the breaker off, each worker probed
on its own by 1 s health checks (tiny checkpoint, the embedded runtime's asym-prefill / asym-decode).

- One P, two Ds, round robin: kill -9 one D. Every request sent while it is dead is answered within
  DEAD_ANSWER_S; from DETECT_S after the kill on, every request is served (by the other D: P never left
  the rotation). The dead D restarted on its port serves a request again within RESTART_SERVE_S of
  being healthy.
- With the router's defaults (breaker on, 10 failures), the same kill of the only D opens P's circuit:
  the router then refuses with "No available prefill workers" although P is healthy. This is the
  routers' behaviour the configuration above works around; if a router version attributes outcomes per
  worker, this pin fails and the note in router_launch.py needs revisiting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from sglang_asym.testing.router_launch import (PrefillWorker, RouterConfig, RouterFlavor, RouterProcess, WorkerHealth,
                                               pick_free_port)
from sglang_asym.testing.server_process import ServerProcess, post, start_server, wait_healthy

from .faults import D_TRANSFER_TIMEOUT_S, record
from .helpers import serving
from .sglang_servers import metric_sum

pytestmark = pytest.mark.timeout(300)

HEALTH = WorkerHealth(interval_s=1, timeout_s=5, failure_threshold=2, success_threshold=1)
TIMEOUT = ("--transfer-timeout", str(D_TRANSFER_TIMEOUT_S))
# A request that met the dead D is answered after at most P's transfer timeout per attempt; 0.3 s each on an
# idle machine, 1.1 s beside the suite's big servers, where one took 8.4 s in CI. The bound catches a hang
# (the client waits 60 s), not speed.
DEAD_ANSWER_S = 4 * D_TRANSFER_TIMEOUT_S
DETECT_S = HEALTH.failure_threshold * HEALTH.interval_s + HEALTH.timeout_s + 2.0  # D out of rotation by then
RESTART_SERVE_S = HEALTH.success_threshold * HEALTH.interval_s + 4.0  # restarted D healthy -> served by it
REQUESTS_WHILE_DEAD = 12
BREAKER_FAILURES = 12  # above the routers' default --cb-failure-threshold of 10
FLAVORS = pytest.mark.parametrize("flavor", [RouterFlavor.SGLANG_ROUTER, RouterFlavor.SMG], ids=lambda f: f.value)


def _body(seed: int) -> dict:
    return {"input_ids": [(seed * 7919 + i * 104729) % 500 + 3 for i in range(150)],
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}


def _served(server: ServerProcess) -> float:
    """Requests a worker finished (the sum of sglang:num_requests_total over finish reasons)."""
    return metric_sum(server, "sglang:num_requests_total") or 0.0


@contextlib.contextmanager
def _router(prefill: ServerProcess, decodes: list[ServerProcess], flavor: RouterFlavor, logs: Path,
            health: WorkerHealth | None, **config) -> Iterator[RouterProcess]:
    router = RouterProcess(RouterConfig(prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),),
                                        decode=tuple(d.url for d in decodes), port=pick_free_port(), flavor=flavor,
                                        health=health, **config),
                           log_path=logs / f"router-{flavor.value}.log")
    router.start(ready_timeout_s=120)
    try:
        yield router
    finally:
        router.stop()


@FLAVORS
def test_a_dead_decode_leaves_prefill_in_rotation_and_serves_again_after_restart(tiny_checkpoint, tmp_path, flavor):
    servers = {"prefill": start_server("asym-prefill", tiny_checkpoint, tmp_path, *TIMEOUT),
               "d1": start_server("asym-decode", tiny_checkpoint, tmp_path, *TIMEOUT),
               "d2": start_server("asym-decode", tiny_checkpoint, tmp_path, *TIMEOUT)}
    with serving(servers, timeout_s=120), \
            _router(servers["prefill"], [servers["d1"], servers["d2"]], flavor, tmp_path, HEALTH,
                    policy="round_robin") as router:
        assert all(post(router.url + "/generate", _body(seed), 60)[0] == 200 for seed in range(2))
        d1 = servers["d1"]
        killed = time.monotonic()
        os.kill(d1.proc.pid, signal.SIGKILL)
        d1.proc.wait(10)
        answers = []
        for seed in range(REQUESTS_WHILE_DEAD):
            sent = time.monotonic()
            status, body = post(router.url + "/generate", _body(100 + seed), 60)
            answers.append((round(sent - killed, 3), status, round(time.monotonic() - sent, 3)))
            assert time.monotonic() - sent < DEAD_ANSWER_S, answers
            assert "No available prefill" not in str(body), answers
            assert status == 200 or sent - killed < DETECT_S, answers
        assert sum(status == 200 for _, status, _ in answers) >= REQUESTS_WHILE_DEAD - 2, answers

        restarted = start_server("asym-decode", tiny_checkpoint, tmp_path, *TIMEOUT, port=d1.port)
        servers["d1"] = restarted  # stopped by serving() on exit
        wait_healthy(restarted, 120)
        healthy = time.monotonic()
        seed = 200
        while _served(restarted) == 0:
            assert time.monotonic() - healthy < RESTART_SERVE_S, "the restarted D gets no request from the router"
            status, body = post(router.url + "/generate", _body(seed), 60)
            assert status == 200, body  # the other D serves meanwhile
            seed += 1
        serve_again_s = time.monotonic() - healthy
    record(f"dead_decode_of_two_{flavor.value}", health_checks=HEALTH.args(), answers_while_dead=answers,
           detect_bound_s=DETECT_S, serve_again_bound_after_healthy_s=RESTART_SERVE_S,
           restarted_decode_served_after_healthy_s=round(serve_again_s, 3))


@FLAVORS
def test_with_the_routers_defaults_a_dead_decode_opens_the_healthy_prefills_circuit(tiny_checkpoint, tmp_path, flavor):
    servers = {"prefill": start_server("asym-prefill", tiny_checkpoint, tmp_path, *TIMEOUT),
               "decode": start_server("asym-decode", tiny_checkpoint, tmp_path, *TIMEOUT)}
    with serving(servers, timeout_s=120), \
            _router(servers["prefill"], [servers["decode"]], flavor, tmp_path, None, retry_max_retries=1) as router:
        assert post(router.url + "/generate", _body(0), 60)[0] == 200
        servers["decode"].proc.kill()
        servers["decode"].proc.wait(10)
        statuses = [post(router.url + "/generate", _body(1 + seed), 60)[0] for seed in range(BREAKER_FAILURES)]
        assert all(status >= 500 for status in statuses), statuses
        status, body = post(router.url + "/generate", _body(99), 60)
        assert status == 503 and "No available prefill" in str(body), (status, body)
        with urllib.request.urlopen(servers["prefill"].url + "/health", timeout=10) as resp:
            assert resp.status == 200  # P itself is up
