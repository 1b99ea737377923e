"""Overload on the product path: `python -m sglang.launch_server --device cpu --disaggregation-mode
asym-prefill | asym-decode` on the nine-layer tiny checkpoint behind sglang-router (default health checks, no
circuit breaker), each worker admitting at most its request pool (--max-running-requests 2; on D also SGLang's 4
extra slots for requests in transfer) + --max-queued-requests 2 requests for at most --asym-request-deadline-s
(sglang_plugin/admission.py), /health answering liveness (sglang_plugin/liveness.py). One module-scoped set:
- 40 concurrent mixed requests (prompts of 1-900 tokens, 4 new tokens each): each one gets its 4 tokens,
  a fast refusal (503; the router keeps the status but not the worker's Retry-After), or a deadline error
  within its bound; none hangs;
- while they run, /health on both workers answers 200 within a second, so the router keeps both in rotation;
- a burst of 200 requests at once: the same, then the pair serves a new request within seconds and
  SGLang's pool counters are back at 0 on both workers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess

from .helpers import ids, serving
from .sglang_servers import greedy, prompt_of, settle, sglang_server, sglang_workspace, used_tokens

pytestmark = pytest.mark.timeout(600)

NEW_TOKENS = 4
CAPACITY, QUEUED = 2, 2  # P holds at most 4 requests (D 8): the pair holds at most 4
DEADLINE_S = 40
REFUSAL_BOUND_S = 5.0  # a refusal is answered within this, however loaded the pair is
ANSWER_BOUND_S = DEADLINE_S + 20  # the deadline, the abort's grace and the router's own overhead
SERVES_AGAIN_BOUND_S = 30.0
# sglang-router evicts a worker whose /health outlasts --health-check-timeout-secs (default 5 s) three
# times in a row; liveness means every answer is a 200 inside that timeout, even on a loaded CI box (the
# probe's own clock runs in the test process beside 40 sender threads, so it reads high under load).
ROUTER_HEALTH_TIMEOUT_S = 5.0
FLAGS = ("--max-running-requests", str(CAPACITY), "--max-queued-requests", str(QUEUED),
         "--asym-request-deadline-s", str(DEADLINE_S))


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One request's answer through the router: HTTP status, the output tokens of a completion, the
    Retry-After header of a refusal, and the seconds until the answer."""

    status: int
    tokens: tuple[int, ...]
    retry_after: str | None
    message: str
    seconds: float

    @property
    def completed(self) -> bool:
        return self.status == 200

    @property
    def refused(self) -> bool:
        return self.status == 503 and "deadline" not in self.message

    @property
    def aborted(self) -> bool:
        return self.status == 503 and "deadline" in self.message


def send(base: str, prompt: list[int], timeout_s: float = ANSWER_BOUND_S + 60) -> Outcome:
    body = json.dumps({"input_ids": prompt, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0,
                                                                "ignore_eos": True}}).encode()
    req = urllib.request.Request(base + "/generate", data=body, headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            out = json.loads(resp.read())
            return Outcome(resp.status, tuple(out["output_ids"]), None, "", time.monotonic() - start)
    except urllib.error.HTTPError as exc:
        raw = exc.read().decode(errors="replace")
        return Outcome(exc.code, (), exc.headers.get("Retry-After"), raw, time.monotonic() - start)


def mixed_prompts(count: int, seed: int) -> list[list[int]]:
    """`count` prompts of 1-900 tokens, spread over the range (short ones N <= W among them)."""
    return [ids(1 + (i * 97 + seed * 31) % 900, seed=seed * 1000 + i) for i in range(count)]


def send_all(base: str, prompts: list[list[int]]) -> list[Outcome]:
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: send(base, p), prompts))


def serves_again(base: str, bound_s: float) -> float:
    """Seconds until a single new request completes (retried after each refusal), at most `bound_s`."""
    start = time.monotonic()
    while time.monotonic() - start < bound_s:
        if send(base, ids(64, seed=7)).completed:
            return time.monotonic() - start
        time.sleep(0.5)
    raise AssertionError(f"the pair did not serve a new request within {bound_s} s")


def check_outcomes(outcomes: list[Outcome]) -> None:
    unclear = [o for o in outcomes if not (o.completed or o.refused or o.aborted)]
    assert not unclear, unclear[:3]
    for o in outcomes:
        if o.completed:
            assert len(o.tokens) == NEW_TOKENS
        if o.refused:
            assert o.seconds < REFUSAL_BOUND_S, o
            assert "sglang-asym" in o.message, o
        assert o.seconds < ANSWER_BOUND_S, o
    assert any(o.completed for o in outcomes)


@dataclasses.dataclass
class HealthProbe:
    """Polls /health on the workers while load runs; records each answer's status and latency."""

    urls: list[str]
    answers: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            for url in self.urls:
                start = time.monotonic()
                try:
                    with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                        status = resp.status
                except (urllib.error.URLError, TimeoutError) as exc:
                    status = getattr(exc, "code", 0)
                self.answers.append((status, time.monotonic() - start))
            self.stop.wait(0.5)


@pytest.fixture(scope="module")
def pair(sglang_tiny_checkpoint, tmp_path_factory):
    checkpoint = sglang_tiny_checkpoint
    _, logs = sglang_workspace(tmp_path_factory, "overload")
    servers = {"prefill": sglang_server("asym-prefill", checkpoint, logs, *FLAGS),
               "decode": sglang_server("asym-decode", checkpoint, logs, *FLAGS)}
    with serving(servers, timeout_s=600):
        # sglang-router's default health checks; the README's router settings for the pair: no circuit
        # breaker (it would count refusals as failures and shut the pair off), no retries (a refusal comes back
        # at once; the client retries after Retry-After)
        router = RouterProcess(RouterConfig(
            prefill=(PrefillWorker(servers["prefill"].url, servers["prefill"].bootstrap_port),),
            decode=(servers["decode"].url,), flavor=RouterFlavor.SGLANG_ROUTER,
            retry_max_retries=1, extra_args=("--disable-circuit-breaker",)), log_path=logs / "router.log")
        router.start(ready_timeout_s=180)
        try:
            # SGLang publishes a fresh worker's used-token gauge with its first stats (D: every 40 decode steps)
            greedy(router.url, prompt_of(150), new_tokens=48, ignore_eos=True)
            yield {**servers, "router": router, "logs": logs}
        finally:
            router.stop()


def test_forty_mixed_requests_complete_or_are_refused_fast_and_health_stays_live(pair):
    probe = HealthProbe([pair["prefill"].url, pair["decode"].url])
    poller = threading.Thread(target=probe.run, daemon=True)
    poller.start()
    try:
        outcomes = send_all(pair["router"].url, mixed_prompts(40, seed=1))
    finally:
        probe.stop.set()
        poller.join()
    check_outcomes(outcomes)
    assert sum(o.refused for o in outcomes) > 0  # 40 at once against a pair that holds 4
    late = [a for a in probe.answers if a[0] != 200 or a[1] >= ROUTER_HEALTH_TIMEOUT_S]
    assert probe.answers and not late, late[:5]
    assert settle([pair["prefill"], pair["decode"]], timeout_s=60) == [0, 0]
    assert serves_again(pair["router"].url, SERVES_AGAIN_BOUND_S) < SERVES_AGAIN_BOUND_S


def test_a_burst_of_200_ends_clearly_and_the_pair_serves_again_within_seconds(pair):
    prompts = [ids(1 + (i * 53) % 300, seed=5000 + i) for i in range(200)]
    outcomes = send_all(pair["router"].url, prompts)
    check_outcomes(outcomes)
    assert sum(o.refused for o in outcomes) > 0
    again = serves_again(pair["router"].url, SERVES_AGAIN_BOUND_S)
    assert again < SERVES_AGAIN_BOUND_S
    assert settle([pair["prefill"], pair["decode"]], timeout_s=30) == [0, 0]
    assert [used_tokens(pair["prefill"]), used_tokens(pair["decode"])] == [0, 0]
