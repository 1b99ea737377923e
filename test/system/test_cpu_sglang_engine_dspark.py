"""`--speculative-algorithm DSPARK` in SGLang's own engine on CPU (`python -m sglang.launch_server --device cpu`):
the platform's speculative worker (sglang_plugin/cpu_platform/dspark_worker.py) drafts with the checkpoint's DSpark blocks
and verifies 1 + k = 6 rows per request in each SGLang TARGET_VERIFY forward (the reference forward's log shows
the verify forwards and their 6-row spans).

With --enable-deterministic-inference (the reference forward runs verify rows as one-row forwards) the
greedy tokens equal the same server's without speculation, for N in {1, 127, 129, 600}, one request at a time
and 4 concurrent requests. Without the flag a forward of 6 rows rounds otherwise than 6 one-row forwards in
the bf16 model, so tokens may differ after a few steps (shown without servers: test_dspark_step.py, and
docs/sglang-engine-cpu.md). A sampled request gets a 400. The server without speculation is the colocated one
of the deterministic stack (conftest.py: the same flags); the speculative one is this module's.
"""

from __future__ import annotations

import pytest

from harness.server_process import post

from .helpers import serving
from .sglang_servers import (DETERMINISTIC, forward_log, greedy, greedy_together, prompt_of, restore, sglang_server,
                             sglang_workspace)

pytestmark = pytest.mark.timeout(1500)

NEW_TOKENS = 12
LENGTHS = (1, 127, 129, 600)
TOGETHER = (5, 64, 129, 200)
DRAFTS = 5  # the checkpoint's dspark_block_size: SGLang's speculative_num_draft_tokens = 6


@pytest.fixture(scope="module")
def speculating(sglang_tiny_checkpoint, tmp_path_factory):
    work, logs = sglang_workspace(tmp_path_factory, "sglang_dspark")
    servers = {"dspark": sglang_server("null", sglang_tiny_checkpoint, logs, DETERMINISTIC,
                                       "--speculative-algorithm", "DSPARK",
                                       env={"SGLANG_ASYM_FORWARD_LOG": str(work / "dspark.jsonl")})}
    with serving(servers, timeout_s=600):
        servers["work"] = work
        yield servers


@pytest.fixture
def stack(speculating, deterministic_stack):
    """The speculative server ("dspark") and the same server without speculation ("plain")."""
    return {**speculating, "plain": deterministic_stack["colocated"]}


@pytest.fixture(autouse=True)
def _shared_servers_back_to_empty(speculating, deterministic_stack):
    """After each case: the servers healthy with empty pools, or restarted and the case failed."""
    yield
    restore(speculating, deterministic_stack)


@pytest.mark.parametrize("n", LENGTHS)
def test_speculative_greedy_tokens_equal_the_server_without_speculation(stack, n):
    (stack["work"] / "dspark.jsonl").unlink(missing_ok=True)
    status, resp = post(stack["dspark"].url + "/generate", {"input_ids": prompt_of(n), "sampling_params": {
        "max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}, timeout_s=900)
    assert status == 200, resp
    assert resp["output_ids"] == greedy(stack["plain"].url, prompt_of(n), NEW_TOKENS, ignore_eos=True), f"N={n}"
    verifies = [f for f in forward_log(stack["work"] / "dspark.jsonl") if f["mode"] == "verify"]
    assert verifies and all([end - start for _, start, end in f["rows"]] == [DRAFTS + 1] for f in verifies)
    first = verifies[0]["rows"][0][1]
    assert first == n  # the prompt's forward gave the first token (at position n): the first verify starts there
    info = resp["meta_info"]
    assert info["spec_num_proposed_drafts"] == DRAFTS * len(verifies)
    # every step emits its accepted drafts and one token of the target's; the last step may emit past the limit
    assert len(verifies) <= NEW_TOKENS - 1


def test_concurrent_requests_equal_the_server_without_speculation(stack):
    prompts = [prompt_of(n) for n in TOGETHER]
    assert greedy_together(stack["dspark"].url, prompts, NEW_TOKENS) == \
        greedy_together(stack["plain"].url, prompts, NEW_TOKENS)


def test_a_sampled_request_is_refused_with_a_400(stack):
    status, resp = post(stack["dspark"].url + "/generate", {"input_ids": [5, 6, 7], "sampling_params": {
        "max_new_tokens": 4, "temperature": 0.7}})
    assert status == 400
    assert "serves greedy requests only: send temperature 0 (got temperature 0.7, top_k -1)" in resp["error"]["message"]
    assert greedy(stack["dspark"].url, prompt_of(3), 4, ignore_eos=True) == \
        greedy(stack["plain"].url, prompt_of(3), 4, ignore_eos=True)
