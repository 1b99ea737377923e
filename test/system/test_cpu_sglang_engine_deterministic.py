"""SGLang's `--enable-deterministic-inference` in its own engine on CPU (`python -m sglang.launch_server --device
cpu`): the same greedy request gives the same tokens alone and inside concurrent batches of 2 and 8 mixed with
other requests (short prompts and windows: prompts longer than W = 128), on the colocated server and through
the asym-prefill / asym-decode pair behind sglang-router, whose decode worker runs the windows as window
steps beside the decoding requests. The reference forward's log (a test aid) shows the target did share
SGLang's forwards with the others. That the outputs can differ without the flag is shown without servers
(test/sglang_plugin/test_reference_forward_deterministic.py: batched logits differ in their last bits).
12 concurrent mixed requests through the pair (generate, completions and chat; streamed and not; windows
among them) all complete and each equals the same request sent alone; sent at once through the stack's P with a
decode worker that speculates (DSPARK, without SGLang's retraction switch), each equals the plain pair's answer.
The pair's output logprobs (`return_logprob`, `top_logprobs_num`) equal, within 1e-5, the log-softmax of the
in-process reference model's logits at each output position (the first token's from D's window step, alone and
riding in a decode forward beside a running request), with the reference's greedy tokens and top entries.
One stack: a colocated server and one pair, all with the flag, shared with the DSpark modules (conftest.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import urllib.request
from pathlib import Path

import pytest

from sglang_asym.sglang_plugin.shared.settings import DEFAULT_SEMANTICS
from harness.server_process import post

from harness.router_launch import RouterFlavor

from .helpers import MODEL, output, serving
from .sglang_servers import (DETERMINISTIC, ONE_CHUNK, asym_reference_logprobs, forward_log, greedy, greedy_together,
                             patient_router, prompt_of, restore, server_info, settle, sglang_server, sglang_workspace)

pytestmark = pytest.mark.timeout(1200)

NEW_TOKENS = 3
TARGET = 140  # a window: B = 12, rows [12, 140) in the 32-row pieces from B
OTHERS = (130, 3, 9, 1, 17, 5, 40)  # a batch of k is the target and the first k - 1 of these (130: a window)
# the others decode this many tokens: on the tiny model a 3-token request is done in a fraction of a second, and
# the target (which on the pair reaches D after P's prefix) then found no one left to share a forward with
OTHER_TOKENS = 32
BATCHES = (2, 8)


@pytest.fixture
def stack(deterministic_stack):
    """The colocated server and the pair behind its router, all with the flag (conftest.py: shared with the
    DSpark modules, which compare against the same configuration)."""
    return deterministic_stack


@pytest.fixture(autouse=True)
def _shared_servers_back_to_empty(stack):
    """After each case: the shared servers healthy with empty pools, or restarted and the case failed."""
    yield
    restore(stack)


def _log(stack, role: str) -> Path:
    return stack["work"] / f"{role}.jsonl"


def _shared_forwards(stack, role: str, target_rows: set[tuple[int, int]]) -> int:
    """Forwards since the log was cleared that ran one of the target's row ranges beside other requests."""
    return sum(1 for f in forward_log(_log(stack, role))
               if len(f["rows"]) > 1 and any((start, end) in target_rows for _, start, end in f["rows"]))


def _alone_and_batched(stack, base: str, role: str, target_rows: set[tuple[int, int]]) -> None:
    target = prompt_of(TARGET)
    alone = greedy(base, target, NEW_TOKENS, ignore_eos=True)
    for k in BATCHES:
        _log(stack, role).unlink(missing_ok=True)
        outputs = greedy_together(base, [target, *(prompt_of(n) for n in OTHERS[:k - 1])],
                                  [NEW_TOKENS] + [OTHER_TOKENS] * (k - 1))
        assert outputs[0] == alone, f"batch of {k}"
        assert _shared_forwards(stack, role, target_rows) >= 1, f"batch of {k}: the target never shared a forward"


def test_every_server_serves_with_the_flag(stack):
    for name in ("colocated", "prefill", "decode"):
        assert server_info(stack[name])["enable_deterministic_inference"] is True, name


def test_colocated_server_gives_the_same_tokens_alone_and_in_batches(stack):
    decode_rows = {(TARGET + i, TARGET + i + 1) for i in range(NEW_TOKENS - 1)}
    _alone_and_batched(stack, stack["colocated"].url, "colocated", {(0, TARGET), *decode_rows})


def test_the_pair_gives_the_same_tokens_alone_and_in_batches(stack):
    window = {(start, min(start + 32, TARGET)) for start in range(TARGET - 128, TARGET, 32)}
    decode_rows = {(TARGET + i, TARGET + i + 1) for i in range(NEW_TOKENS - 1)}
    _alone_and_batched(stack, stack["router"].url, "decode", window | decode_rows)


def _mixed_call(i: int, n: int) -> tuple[str, dict]:
    """Call i of the mixed dozen: generate, completions and chat in turn, every other one streamed. The
    OpenAI routes get text prompts (sglang-router refuses token-id prompts there with a 422)."""
    kind, stream = ("generate", "completions", "chat")[i % 3], bool(i % 2)
    if kind == "generate":
        return "/generate", {"input_ids": prompt_of(n), "stream": stream, "sampling_params": {
            "max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}
    common = {"model": MODEL, "max_tokens": NEW_TOKENS, "temperature": 0, "stream": stream, "ignore_eos": True}
    if kind == "completions":
        return "/v1/completions", {**common, "prompt": "tell me " * (n // 2)}
    return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "tell me " * (n // 2)}]}


TWELVE = (3, 64, 129, 200, 257, 40, 20, 140, 300, 90, 180, 130)  # prompt lengths of the mixed dozen


def test_twelve_concurrent_mixed_requests_complete_and_equal_each_alone(stack):
    calls = [_mixed_call(i, n) for i, n in enumerate(TWELVE)]
    base = stack["router"].url
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        together = list(pool.map(lambda call: output(call[0], call[1], base), calls))
    alone = [output(path, body, base) for path, body in calls]
    for (path, _), result in zip(calls, together):
        if path == "/generate":
            assert len(result[0]) == NEW_TOKENS
        else:
            assert isinstance(result, str)
    assert together == alone


@pytest.fixture
def speculating_router(stack, sglang_tiny_checkpoint, tmp_path_factory):
    """The stack's P with an asym-decode D that speculates (DSPARK, with the flag; no retraction switch, whose
    rebootstrapped lifecycles may end in other tokens) behind a router of its own; stopped after the case."""
    work, logs = sglang_workspace(tmp_path_factory, "sglang_deterministic_dspark")
    servers = {"decode": sglang_server("asym-decode", sglang_tiny_checkpoint, logs, DETERMINISTIC,
                                       "--speculative-algorithm", "DSPARK",
                                       env={"SGLANG_ASYM_FORWARD_LOG": str(work / "decode.jsonl")})}
    with serving(servers, timeout_s=600):
        with patient_router(stack["prefill"], servers["decode"], RouterFlavor.SGLANG_ROUTER) as router:
            yield router, servers["decode"], work / "decode.jsonl"


def test_twelve_concurrent_mixed_requests_through_a_speculating_decode_equal_the_plain_pairs(stack,
                                                                                             speculating_router):
    router, decode, decode_log = speculating_router
    calls = [_mixed_call(i, n) for i, n in enumerate(TWELVE)]
    plain = [output(path, body, stack["router"].url) for path, body in calls]
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        speculated = list(pool.map(lambda call: output(call[0], call[1], router.url), calls))
    assert speculated == plain
    assert settle([stack["prefill"], decode]) == [0, 0]
    forwards = forward_log(decode_log)
    assert {f["mode"] for f in forwards} == {"extend", "verify"}  # windows as extends, then verify forwards
    assert all(end - start == 6 for f in forwards if f["mode"] == "verify" for _, start, end in f["rows"])  # 1 + k


LOGPROB_TOKENS = 4
TOP_LOGPROBS = 3
LOGPROB_TOLERANCE = 1e-5
RUNNER = (9, 96)  # a request decoding while the target's window runs: prompt length, new tokens


def _with_logprobs(base: str, prompt: list[int]) -> dict:
    status, body = post(base + "/generate", {
        "input_ids": prompt, "return_logprob": True, "top_logprobs_num": TOP_LOGPROBS,
        "sampling_params": {"max_new_tokens": LOGPROB_TOKENS, "temperature": 0, "ignore_eos": True}}, timeout_s=600)
    assert status == 200, body
    return body


def _streamed_tokens(base: str, prompt: list[int], new_tokens: int, decoding: threading.Event) -> int:
    """A streamed greedy request; `decoding` is set once its first token came (it decodes from then on).
    Returns its output token count."""
    request = urllib.request.Request(base + "/generate", headers={"Content-Type": "application/json"}, data=json.dumps({
        "input_ids": prompt, "stream": True,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}).encode())
    last = None
    try:
        with urllib.request.urlopen(request, timeout=600) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data:") and line != "data: [DONE]":
                    last = json.loads(line[len("data:"):])
                    decoding.set()
    finally:
        decoding.set()  # the waiting case fails on the count instead of hanging
    return 0 if last is None else last["meta_info"]["completion_tokens"]


def _assert_reference_logprobs(body: dict, tokens: list[int], logprobs) -> None:
    """One entry per output token, each (logprob, token id, text) and its top entries, as the reference gives."""
    meta = body["meta_info"]
    assert body["output_ids"] == tokens
    entries, tops = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert [entry[1] for entry in entries] == tokens and len(tops) == LOGPROB_TOKENS
    for i, ((logprob, token, _), top) in enumerate(zip(entries, tops)):
        assert abs(logprob - float(logprobs[i, token])) <= LOGPROB_TOLERANCE, (i, logprob, float(logprobs[i, token]))
        values, ids = logprobs[i].topk(TOP_LOGPROBS)
        assert [entry[1] for entry in top] == ids.tolist(), i
        assert all(abs(entry[0] - float(v)) <= LOGPROB_TOLERANCE for entry, v in zip(top, values)), (i, top)


def test_the_pairs_output_logprobs_equal_the_references(stack, sglang_tiny_checkpoint):
    base = stack["router"].url
    for n in (TARGET, 40):  # a window after P's prefix [0, 12); a prompt within W, which P does not compute
        prompt = prompt_of(n)
        tokens, logprobs = asym_reference_logprobs(sglang_tiny_checkpoint, prompt, ONE_CHUNK,
                                                   DEFAULT_SEMANTICS, LOGPROB_TOKENS)
        _assert_reference_logprobs(_with_logprobs(base, prompt), tokens, logprobs)
        _log(stack, "decode").unlink(missing_ok=True)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            decoding = threading.Event()
            runner = pool.submit(_streamed_tokens, base, prompt_of(RUNNER[0]), RUNNER[1], decoding)
            assert decoding.wait(timeout=600), runner.result()
            _assert_reference_logprobs(_with_logprobs(base, prompt), tokens, logprobs)  # sent while the runner decodes
            assert runner.result() == RUNNER[1]
        window_rows = {(start, min(start + 32, n)) for start in range(max(n - 128, 0), n, 32)}
        mixed = [f for f in forward_log(_log(stack, "decode"))
                 if f["mode"] == "mixed" and any((s, e) in window_rows for _, s, e in f["rows"][f["decode_rows"]:])]
        assert mixed, f"N = {n}: the window never rode in a decode forward beside the runner"
