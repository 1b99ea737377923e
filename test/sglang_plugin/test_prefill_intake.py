"""The asym-prefill intake cut (prefill_cut.py and its hook on SGLang's `PrefillBootstrapQueue.add`).

Pure logic against the core's SplitPlan in this process; the hook on SGLang's own queue, Req and fake
transfer sender in a process of its own (sglang_cpu_checks.py intake), where an asymmetric scheduler's
publish installs it."""

import json
from array import array
from types import SimpleNamespace

import pytest

from sglang_asym.config import V41Config
from sglang_asym.sglang_plugin.prefill.cut import (
    PrefillCut, PrefillCutError, cut_request, prefill_cut_for, prompt_len_of)
from sglang_asym.sglang_plugin.shared.admission_check import PROMPT_LOGPROBS_MESSAGE
from sglang_asym.sglang_plugin.shared.settings import AsymSettings
from sglang_asym.split import SplitError, SplitPlan

from .conftest import REPO, run_python

CFG = V41Config.tiny()
WINDOW = 16


def fresh_req(prompt_len: int, rid: str = "r") -> SimpleNamespace:
    """The Req fields prefill_cut reads, as SGLang's Req initialises them (the real class is driven below)."""
    ids = array("q", [1000 + t for t in range(prompt_len)])
    return SimpleNamespace(rid=rid, origin_input_ids=ids, origin_input_ids_unpadded=ids, output_ids=array("q"),
                           full_untruncated_fill_ids=array("q"), extend_end=None, logprob_start_len=prompt_len)


@pytest.mark.parametrize("prompt_len", [1, WINDOW - 1, WINDOW, WINDOW + 1, 301, 8192])
@pytest.mark.parametrize("semantics", ["asym", "asym-exact-encoder"])
def test_cut_is_the_split_plans_boundary(prompt_len, semantics):
    settings = AsymSettings("asym-prefill", window=WINDOW, semantics=semantics)
    cut = prefill_cut_for(CFG, settings, prompt_len)
    assert cut == PrefillCut(prompt_len, SplitPlan(CFG, prompt_len, WINDOW, semantics).boundary)
    assert cut.boundary == max(prompt_len - WINDOW, 0)
    assert cut.runs_forward is (prompt_len > WINDOW)
    assert cut.prompt_len - cut.boundary == min(prompt_len, WINDOW)  # the tokens D computes: [B, N)


def test_cut_refuses_other_roles_and_bad_prompts():
    with pytest.raises(PrefillCutError, match="only the asym-prefill role"):
        prefill_cut_for(CFG, AsymSettings("asym-decode", window=WINDOW), 100)
    with pytest.raises(SplitError, match="exceeds max_position_embeddings 8192"):
        prefill_cut_for(CFG, AsymSettings("asym-prefill", window=WINDOW), 8193)
    with pytest.raises(SplitError, match="exceeds the model's sliding window"):
        prefill_cut_for(CFG, AsymSettings("asym-prefill", window=CFG.sliding_window + 1), 500)


def test_cut_request_keeps_the_first_b_tokens():
    req = fresh_req(301)
    cut = prefill_cut_for(CFG, AsymSettings("asym-prefill", window=WINDOW), 301)
    cut_request(req, cut)
    assert list(req.origin_input_ids) == [1000 + t for t in range(285)]
    assert req.origin_input_ids_unpadded is req.origin_input_ids
    assert isinstance(req.origin_input_ids, array) and req.origin_input_ids.typecode == "q"
    assert len(req.full_untruncated_fill_ids) == 0 and req.logprob_start_len == 285
    assert prompt_len_of(req) == 301


def test_cut_request_refuses_what_it_cannot_cut():
    cut = PrefillCut(40, 24)
    req = fresh_req(40)
    cut_request(req, cut)
    with pytest.raises(PrefillCutError, match="already cut to 24 tokens"):
        cut_request(req, cut)
    with pytest.raises(PrefillCutError, match="has 41 prompt tokens, the cut was made for 40"):
        cut_request(fresh_req(41), cut)
    scheduled = fresh_req(40)
    scheduled.extend_end = 40
    with pytest.raises(PrefillCutError, match="already scheduled"):
        cut_request(scheduled, cut)
    padded = fresh_req(40)
    padded.origin_input_ids_unpadded = padded.origin_input_ids[:30]
    with pytest.raises(PrefillCutError, match="padded prompt"):
        cut_request(padded, cut)
    assert prompt_len_of(padded) is None and len(padded.origin_input_ids) == 40


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    config_dir = tmp_path_factory.mktemp("tiny_cfg")
    CFG.write_json(config_dir)
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "intake", str(config_dir), str(WINDOW)])
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


def test_hook_is_installed_only_by_an_asymmetric_scheduler(report):
    assert report["symmetric_untouched"] is True
    assert report["installed"] is True and report["idempotent"] is True


def test_sglangs_queue_takes_the_cut_request(report):
    prompt = [1000 + t for t in range(WINDOW + 5)]
    long = report["prefill"]["long"]
    assert long == {"ids": prompt[:5], "unpadded": prompt[:5], "fill_ids": prompt[:5], "seqlen": 5,
                    "prompt_len": WINDOW + 5, "max_new_tokens": 1, "sender": "FakeKVSender", "finished": None,
                    "zero_compute": False}
    assert report["prefill"]["long_readded"] == long  # a requeued request is not cut again


def test_a_prompt_within_the_window_is_cut_to_nothing_and_marked_zero_compute(report):
    assert report["prefill"]["at_window"] == {
        "ids": [], "unpadded": [], "fill_ids": [], "seqlen": 0, "prompt_len": WINDOW, "max_new_tokens": 1,
        "sender": "FakeKVSender", "finished": None, "zero_compute": True}
    assert report["queued"] == ["long", "long", "at_window", "output_logprobs"]


def test_unservable_prompts_are_refused_through_sglangs_abort(report):
    too_long, logprobs = report["prefill"]["too_long"], report["prefill"]["prompt_logprobs"]
    assert too_long["finished"] == {"type": "FINISH_ABORT", "status": 400, "message":
                                    "sglang-asym: prompt of 8193 tokens exceeds max_position_embeddings 8192"}
    assert too_long["sender"] is None
    assert logprobs["finished"] == {"type": "FINISH_ABORT", "status": 400, "message": PROMPT_LOGPROBS_MESSAGE}
    assert logprobs["sender"] is None and logprobs["prompt_len"] is None and logprobs["seqlen"] == WINDOW + 5
    assert report["streamed"] == ["too_long", "prompt_logprobs"]


def test_a_request_for_output_logprobs_is_cut_like_any_other(report):
    """P computes no output token (its placeholder's logprobs are dropped by D's commit hook): the request is
    cut, and its output-only start N becomes B, still past every row P computes."""
    prompt = [1000 + t for t in range(WINDOW + 5)]
    assert report["prefill"]["output_logprobs"] == {
        "ids": prompt[:5], "unpadded": prompt[:5], "fill_ids": prompt[:5], "seqlen": 5, "prompt_len": WINDOW + 5,
        "max_new_tokens": 1, "sender": "FakeKVSender", "finished": None, "zero_compute": False}
    assert report["prefill"]["output_logprobs_start"] == 5


def test_decode_role_requests_are_untouched(report):
    decode = report["decode_untouched"]
    assert decode["seqlen"] == WINDOW + 5 and decode["prompt_len"] is None and decode["finished"] is None
