"""admission_check.py over SGLang's own GenerateReqInput, normalized as the tokenizer manager does before
`_init_req_state`: what both asymmetric roles refuse before any bootstrap, and what they admit."""

import pytest

from sglang_asym.sglang_plugin.shared.admission_check import (LOGPROBS_MESSAGE, PARALLEL_SAMPLING_MESSAGE,
                                                       AsymAdmissionError, around_init_req_state, refusal_of)


def _as_sent(**fields):
    """A GenerateReqInput as the HTTP front hands it to generate_request, before SGLang normalizes it."""
    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS

    cpu_import_gaps.install(STARTUP_GAPS)
    from sglang.srt.managers.io_struct import GenerateReqInput

    return GenerateReqInput(**fields)


def _normalized(**fields):
    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS

    cpu_import_gaps.install(STARTUP_GAPS)  # SGLang's io_struct imports what a CPU-only venv lacks
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(**fields)
    obj.normalize_batch_and_arguments()
    return obj


@pytest.mark.parametrize("fields", [
    {"text": "hi", "return_logprob": True},
    {"text": "hi", "return_logprob": True, "top_logprobs_num": 2},
    {"text": "hi", "return_logprob": True, "logprob_start_len": 0},
    {"text": ["a", "b"], "return_logprob": [False, True]},
])
def test_logprobs_are_refused(fields):
    assert refusal_of(_normalized(**fields)) == LOGPROBS_MESSAGE


def test_parallel_sampling_is_refused():
    assert refusal_of(_normalized(text="hi", sampling_params={"n": 3, "temperature": 0.7})) == \
        PARALLEL_SAMPLING_MESSAGE.format(n=3)


@pytest.mark.parametrize("fields, message", [
    ({"text": "hi", "return_logprob": True, "top_logprobs_num": 2}, LOGPROBS_MESSAGE),
    ({"text": "hi", "sampling_params": {"n": 2, "temperature": 0.7}}, PARALLEL_SAMPLING_MESSAGE.format(n=2)),
    ({"text": ["a", "b"], "sampling_params": [{"n": 4}, {"n": 4}]}, PARALLEL_SAMPLING_MESSAGE.format(n=4)),
    ({"text": "hi", "sampling_params": {"n": 1}}, None),
    ({"input_ids": [1, 2, 3]}, None),
])
def test_the_admission_gate_reads_the_request_as_it_arrived(fields, message):
    """admission.py asks before SGLang normalizes the request (parallel_sample_num is still 1 then)."""
    assert refusal_of(_as_sent(**fields)) == message


@pytest.mark.parametrize("fields", [
    {"text": "hi"},
    {"input_ids": [1, 2, 3], "sampling_params": {"n": 1, "max_new_tokens": 4}},
    {"text": ["a", "b"], "sampling_params": {"temperature": 0}},
])
def test_what_the_pair_serves_is_admitted(fields):
    assert refusal_of(_normalized(**fields)) is None


def test_the_hook_raises_a_400_before_any_state_and_passes_the_rest_through():
    calls = []

    def original(manager, obj, request=None):
        calls.append(obj)
        return "state"

    with pytest.raises(AsymAdmissionError) as refused:
        around_init_req_state(original, None, _normalized(text="hi", return_logprob=True), None)
    assert refused.value.status_code == 400 and calls == []
    admitted = _normalized(text="hi")
    assert around_init_req_state(original, None, admitted, None) == "state" and calls == [admitted]
