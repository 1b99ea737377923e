"""`--speculative-algorithm DSPARK` on the asym-decode worker of SGLang's engine on CPU: an asym-prefill P
(no speculation: it ships [0, B) only) and an asym-decode D that computes the window [B, N) as its own EXTEND
forwards through the platform's speculative worker (the window's features are the drafter's context), then
decodes speculatively, 1 + k = 6 rows per request in each TARGET_VERIFY forward.

With --enable-deterministic-inference on both workers, the greedy tokens through sglang-router equal those of
the same P with a D without speculation, for N in {1, 127, 129, 600} one at a time. The speculative D also
runs SGLang's retraction switch (every third decode forward retracts a request of the running batch, never
the last one): of 4 concurrent requests some are retracted mid-speculation and rebootstrapped through P
(P computes the prompt and the output tokens but the last again, D runs that sequence's window and replays
the kept token), and each lifecycle's tokens equal the reference model's for that lifecycle, as the plain D's
(never retracted) equal it for their one lifecycle. The P and the plain D are the deterministic stack's pair
(conftest.py: the same flags) and answer first; then the speculative D starts beside them, behind a router of
its own with the same P, and is stopped when its requests are answered.
A request for output logprobs (top 3) gets from the speculative D the plain D's entries within 1e-5: the first
token's from D's window EXTEND through the speculative worker, the rest from SGLang's compute_spec_logprobs
over the verify rows.
A constrained request, which the speculating D refuses and its P would serve, ends on both roles at once: the
client gets D's 400 within 2 s, P refuses or aborts its copy, both pools are empty.
"""

from __future__ import annotations

import json
import time

import pytest

from harness.router_launch import RouterFlavor

from sglang_asym.model.loading import model_from_checkpoint
from harness.server_process import post

from .helpers import serving
from .sglang_servers import (DETERMINISTIC, RETRACT_ENV, RETRACTED, forward_log, greedy, greedy_together, metric_sum,
                             patient_router, prompt_of, reference_lifecycle, restore, settle, sglang_server,
                             sglang_workspace)

pytestmark = pytest.mark.timeout(1800)

NEW_TOKENS = 12
LENGTHS = (1, 127, 129, 600)
TOGETHER = (5, 131, 200, 300)  # lengths none of LENGTHS has: D's log tells the requests apart by N
DRAFTS = 5  # the checkpoint's dspark_block_size
PREFILL_CHUNK = 8192  # every prefix of these prompts runs in one forward on P
LOGPROBS_N, TOP_LOGPROBS = 260, 3  # a length neither LENGTHS nor TOGETHER has
CONSTRAINED_N = 333  # nor this one (nor the next requests', one and two longer): P would compute a prefix
REFUSAL_S = 2.0


def _with_logprobs(router_url: str) -> dict:
    status, body = post(router_url + "/generate", {
        "input_ids": prompt_of(LOGPROBS_N), "return_logprob": True, "top_logprobs_num": TOP_LOGPROBS,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}, timeout_s=600)
    assert status == 200, body
    return {"output_ids": body["output_ids"], "tokens": body["meta_info"]["output_token_logprobs"],
            "top": body["meta_info"]["output_top_logprobs"]}


def _outputs(router_url: str, prefill, decode) -> dict:
    alone = {n: greedy(router_url, prompt_of(n), NEW_TOKENS, ignore_eos=True) for n in LENGTHS}
    together = greedy_together(router_url, [prompt_of(n) for n in TOGETHER], NEW_TOKENS)
    logprobs = _with_logprobs(router_url)  # alone: SGLang's retraction switch never retracts the last request
    return {"alone": alone, "together": together, "logprobs": logprobs,
            "retracted": metric_sum(decode, RETRACTED) or 0.0, "used_tokens": settle([prefill, decode])}


def _constrained_refused_by_d(router_url: str, prefill, decode, next_n: int) -> dict:
    """A constrained request, which only the speculating D refuses (its P does not speculate and would serve it):
    the answer, its seconds, both pools after it, what P's log said meanwhile, and the tokens of the next
    request (`next_n` tokens)."""
    p_log_before = len(prefill.log.read_text(errors="replace"))
    start = time.monotonic()
    status, body = post(router_url + "/generate", {"input_ids": prompt_of(CONSTRAINED_N), "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "regex": "(ab|cd)+"}}, timeout_s=60)
    took = time.monotonic() - start
    used = settle([prefill, decode], timeout_s=REFUSAL_S)
    p_said = prefill.log.read_text(errors="replace")[p_log_before:]
    return {"status": status, "body": json.dumps(body), "took": took, "used": used, "p_said": p_said,
            "next": greedy(router_url, prompt_of(next_n), 4, ignore_eos=True)}


def _lifecycles(forwards: list[dict]) -> dict[int, list[int]]:
    """Per bootstrap room, the end M of each lifecycle's window on D (oldest first): a lifecycle's window
    chunks follow each other, a rebootstrap's window starts again below the previous end. The first M is
    the prompt length N; a rebootstrap's M = N + j, where j output tokens went to P and token j is replayed."""
    ends: dict[int, list[int]] = {}
    for forward in forwards:
        if forward["mode"] != "extend":
            continue
        for room, start, end in forward["rows"]:
            if not room:
                continue
            lives = ends.setdefault(room, [])
            if lives and start == lives[-1]:
                lives[-1] = end
            else:
                lives.append(end)
    return ends


@pytest.fixture(scope="module")
def runs(sglang_tiny_checkpoint, deterministic_stack, tmp_path_factory):
    checkpoint, stack = sglang_tiny_checkpoint, deterministic_stack
    work, logs = sglang_workspace(tmp_path_factory, "sglang_asym_dspark")
    decode_log = work / "decode.jsonl"
    without = _outputs(stack["router"].url, stack["prefill"], stack["decode"])
    speculating = {"decode": sglang_server("asym-decode", checkpoint, logs, DETERMINISTIC, "--speculative-algorithm",
                                           "DSPARK", env={"SGLANG_ASYM_FORWARD_LOG": str(decode_log), **RETRACT_ENV})}
    with serving(speculating, timeout_s=600):
        with patient_router(stack["prefill"], speculating["decode"], RouterFlavor.SGLANG_ROUTER) as router:
            with_dspark = _outputs(router.url, stack["prefill"], speculating["decode"])
            constrained = {"sglang-router": _constrained_refused_by_d(router.url, stack["prefill"],
                                                                      speculating["decode"], CONSTRAINED_N + 1)}
        with patient_router(stack["prefill"], speculating["decode"], RouterFlavor.SMG) as smg:
            constrained["smg"] = _constrained_refused_by_d(smg.url, stack["prefill"], speculating["decode"],
                                                           CONSTRAINED_N + 2)
    return {"without": without, "with": with_dspark, "forwards": forward_log(decode_log), "checkpoint": checkpoint,
            "constrained": constrained}


@pytest.fixture(autouse=True)
def _shared_servers_back_to_empty(runs, deterministic_stack):
    """After each case: the shared servers healthy with empty pools, or restarted and the case failed."""
    yield
    restore(deterministic_stack)


@pytest.mark.parametrize("n", LENGTHS)
def test_speculative_asym_decode_equals_the_pair_without_speculation(runs, n):
    assert runs["with"]["alone"][n] == runs["without"]["alone"][n], f"N={n}"


def test_speculative_asym_decode_returns_the_plain_pairs_output_logprobs(runs):
    plain, speculated = runs["without"]["logprobs"], runs["with"]["logprobs"]
    assert speculated["output_ids"] == plain["output_ids"] and len(plain["output_ids"]) == NEW_TOKENS
    assert [entry[1] for entry in speculated["tokens"]] == plain["output_ids"]
    assert len(speculated["top"]) == len(plain["top"]) == NEW_TOKENS
    for i, (got, want) in enumerate(zip(speculated["tokens"], plain["tokens"])):
        assert abs(got[0] - want[0]) <= 1e-5, (i, got, want)
    for i, (got, want) in enumerate(zip(speculated["top"], plain["top"])):
        assert [entry[1] for entry in got] == [entry[1] for entry in want] and len(got) == TOP_LOGPROBS, i
        assert all(abs(g[0] - w[0]) <= 1e-5 for g, w in zip(got, want)), (i, got, want)


def test_retracted_speculating_requests_equal_the_reference_of_each_lifecycle(runs):
    """A retraction moves the decoder layers' floors (the rebootstrap's window is that of the longer sequence),
    so a retracted request's later tokens may differ from an uninterrupted run; each lifecycle is checked
    against the reference model computing that lifecycle (its sequence, its floors, the replayed token)."""
    assert runs["with"]["retracted"] > 0
    assert runs["with"]["used_tokens"] == [0, 0] and runs["without"]["used_tokens"] == [0, 0]
    rooms = list(_lifecycles(runs["forwards"]).values())
    lives = {ends[0]: ends for ends in rooms}
    # a room per request; the constrained request D refused at its launcher never reached D's scheduler
    assert sorted(ends[0] for ends in rooms) == sorted(LENGTHS + TOGETHER + (LOGPROBS_N, CONSTRAINED_N + 1,
                                                                             CONSTRAINED_N + 2))
    assert any(len(lives[n]) > 1 for n in TOGETHER), lives  # a request was rebootstrapped mid-speculation
    model = model_from_checkpoint(runs["checkpoint"], cache_quant="release")  # the v41 pool's formats
    try:
        for n, plain, speculated in zip(TOGETHER, runs["without"]["together"], runs["with"]["together"]):
            prompt = prompt_of(n)
            # the anchor: the plain D, never retracted, computes one lifecycle as the reference does
            assert plain == reference_lifecycle(model, prompt, PREFILL_CHUNK, NEW_TOKENS), f"N={n}"
            if len(lives[n]) == 1:
                assert speculated == plain, f"N={n}"
                continue
            replays = [m - n for m in lives[n][1:]]  # the output index each rebootstrap replays
            expected = reference_lifecycle(model, prompt, PREFILL_CHUNK, replays[0] + 1)
            for i, j in enumerate(replays):
                stop = replays[i + 1] + 1 if i + 1 < len(replays) else NEW_TOKENS
                expected += reference_lifecycle(model, prompt + speculated[:j], PREFILL_CHUNK, stop - j - 1,
                                                replayed=speculated[j])
            assert speculated == expected, f"N={n}: lifecycles at {lives[n]}"
    finally:
        del model


def test_d_ran_the_windows_as_extends_and_decoded_in_verify_forwards_of_six_rows(runs):
    forwards = runs["forwards"]
    modes = {f["mode"] for f in forwards}
    assert modes == {"extend", "verify"}  # no mixed forwards: a verify forward takes no window riders
    verifies = [f for f in forwards if f["mode"] == "verify"]
    assert all(end - start == DRAFTS + 1 for f in verifies for _, start, end in f["rows"])
    # the window of N = 600 is [472, 600): D's first verify of that request starts at N
    assert any(start == 600 for f in verifies for _, start, _ in f["rows"])
    assert any(start == 472 for f in forwards if f["mode"] == "extend" for _, start, _ in f["rows"])


@pytest.mark.parametrize("router", ["sglang-router", "smg"])
def test_a_request_only_the_speculating_decode_refuses_ends_on_both_roles_at_once(runs, router):
    """Constrained decoding is refused by the speculating D alone (its launcher, a 400) after D's admission
    question admitted the room on P: D's close of the room carries its 400 to P (shared/admission.py), which
    refuses its copy on arrival with it, or aborts the copy in flight and answers with it. The client gets D's
    400 within REFUSAL_S through sglang-router (which answers with D's status) and through smg (which answers
    P's error itself), both pools are empty, and the next request is served."""
    refused = runs["constrained"][router]
    assert refused["status"] == 400 and refused["took"] < REFUSAL_S, refused
    assert "does not serve constrained decoding (regex)" in refused["body"], refused["body"]
    assert refused["used"] == [0, 0]
    assert ("with the 400 it was closed with" in refused["p_said"]
            or "closed by the decode worker: aborting request" in refused["p_said"]), refused["p_said"][-3000:]
    assert len(refused["next"]) == 4
