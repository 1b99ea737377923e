"""`--speculative-algorithm DSPARK` on the asym-decode worker of SGLang's engine on CPU: an asym-prefill P
(no speculation: it ships [0, B) only) and an asym-decode D that computes the window [B, N) as its own EXTEND
forwards through the platform's speculative worker (the window's features are the drafter's context), then
decodes speculatively, 1 + k = 6 rows per request in each TARGET_VERIFY forward.

With --enable-deterministic-inference on both workers, the greedy tokens through sglang-router equal those of
the same P with a D without speculation, for N in {1, 127, 129, 600} one at a time and 4 concurrent
requests. One P throughout, and one D at a time: the plain D answers first and is stopped, then the
speculative D starts behind a new router; every server is stopped at the end.
"""

from __future__ import annotations

import pytest

from sglang_asym.runtime.router_launch import RouterFlavor

from .helpers import serving
from .sglang_servers import forward_log, greedy, greedy_together, patient_router, prompt_of, sglang_server, sglang_workspace

pytestmark = pytest.mark.timeout(1800)

FLAG = "--enable-deterministic-inference"
NEW_TOKENS = 12
LENGTHS = (1, 127, 129, 600)
TOGETHER = (5, 129, 200, 300)
DRAFTS = 5  # the checkpoint's dspark_block_size


def _outputs(prefill, decode) -> dict:
    with patient_router(prefill, decode, RouterFlavor.SGLANG_ROUTER) as router:
        alone = {n: greedy(router.url, prompt_of(n), NEW_TOKENS, ignore_eos=True) for n in LENGTHS}
        together = greedy_together(router.url, [prompt_of(n) for n in TOGETHER], NEW_TOKENS)
    return {"alone": alone, "together": together}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work, checkpoint, logs = sglang_workspace(tmp_path_factory, "sglang_asym_dspark")
    decode_log = work / "decode.jsonl"
    prefill = {"prefill": sglang_server("asym-prefill", checkpoint, logs, FLAG)}
    with serving(prefill, timeout_s=600):
        with serving({"decode": sglang_server("asym-decode", checkpoint, logs, FLAG)}, timeout_s=600) as plain:
            without = _outputs(prefill["prefill"], plain["decode"])
        speculating = {"decode": sglang_server("asym-decode", checkpoint, logs, FLAG, "--speculative-algorithm", "DSPARK",
                                               env={"SGLANG_ASYM_FORWARD_LOG": str(decode_log)})}
        with serving(speculating, timeout_s=600):
            with_dspark = _outputs(prefill["prefill"], speculating["decode"])
    return {"without": without, "with": with_dspark, "forwards": forward_log(decode_log)}


@pytest.mark.parametrize("n", LENGTHS)
def test_speculative_asym_decode_equals_the_pair_without_speculation(runs, n):
    assert runs["with"]["alone"][n] == runs["without"]["alone"][n], f"N={n}"


def test_concurrent_requests_equal_the_pair_without_speculation(runs):
    assert runs["with"]["together"] == runs["without"]["together"]


def test_d_ran_the_windows_as_extends_and_decoded_in_verify_forwards_of_six_rows(runs):
    forwards = runs["forwards"]
    modes = {f["mode"] for f in forwards}
    assert modes == {"extend", "verify"}  # no mixed forwards: a verify forward takes no window riders
    verifies = [f for f in forwards if f["mode"] == "verify"]
    assert all(end - start == DRAFTS + 1 for f in verifies for _, start, end in f["rows"])
    # the window of N = 600 is [472, 600): D's first verify of that request starts at N
    assert any(start == 600 for f in verifies for _, start, _ in f["rows"])
    assert any(start == 472 for f in forwards if f["mode"] == "extend" for _, start, _ in f["rows"])
