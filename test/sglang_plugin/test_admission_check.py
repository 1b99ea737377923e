"""admission_check.py over SGLang's own GenerateReqInput, normalized as the tokenizer manager does before
`_init_req_state`: what both asymmetric roles refuse before any bootstrap, and what they admit."""

import pytest

from sglang_asym.sglang_plugin.shared.admission_check import (PARALLEL_SAMPLING_MESSAGE, PROMPT_LOGPROBS_MESSAGE,
                                                              TOP_LOGPROBS_MESSAGE, AsymAdmissionError,
                                                              around_init_req_state, refusal_of)


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
    {"text": "hi", "return_logprob": True, "logprob_start_len": 0},  # an OpenAI completion with echo and logprobs
    {"text": "hi", "return_logprob": True, "logprob_start_len": 40},  # a text prompt's length is not known yet
    {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 2},
    {"text": ["a", "b"], "return_logprob": [False, True], "logprob_start_len": [-1, 0]},
    {"input_ids": [[1, 2], [3, 4, 5]], "return_logprob": True, "logprob_start_len": [2, 1]},
])
def test_prompt_logprobs_are_refused(fields):
    assert refusal_of(_normalized(**fields)) == PROMPT_LOGPROBS_MESSAGE


@pytest.mark.parametrize("fields", [
    {"text": "hi", "return_logprob": True},  # SGLang's default start -1: output logprobs only
    {"text": "hi", "return_logprob": True, "top_logprobs_num": 2},  # an OpenAI completion with logprobs=2
    {"text": "hi", "return_logprob": True, "top_logprobs_num": 128},
    {"text": "hi", "return_logprob": True, "token_ids_logprob": [5, 7]},
    {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 3},  # starts at the prompt's end
    {"text": "hi", "return_logprob": False, "logprob_start_len": 0},  # no logprobs asked: the start is ignored
    {"text": ["a", "b"], "return_logprob": [False, True], "top_logprobs_num": [0, 5]},
])
def test_output_logprobs_are_admitted(fields):
    assert refusal_of(_normalized(**fields)) is None


def test_more_top_logprobs_than_pds_metadata_carries_are_refused():
    assert refusal_of(_normalized(text="hi", return_logprob=True, top_logprobs_num=129)) == \
        TOP_LOGPROBS_MESSAGE.format(n=129)
    assert "top_logprobs_num = 129 exceeds the 128 top logprobs per token" in TOP_LOGPROBS_MESSAGE.format(n=129)


def test_parallel_sampling_is_refused():
    assert refusal_of(_normalized(text="hi", sampling_params={"n": 3, "temperature": 0.7})) == \
        PARALLEL_SAMPLING_MESSAGE.format(n=3)


@pytest.mark.parametrize("fields, message", [
    ({"text": "hi", "return_logprob": True, "top_logprobs_num": 2}, None),
    ({"text": "hi", "return_logprob": True, "logprob_start_len": 0}, PROMPT_LOGPROBS_MESSAGE),
    ({"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 5}, None),
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
        around_init_req_state(original, None, _normalized(text="hi", return_logprob=True,
                                                                   logprob_start_len=0), None)
    assert refused.value.status_code == 400 and calls == []
    admitted = _normalized(text="hi")
    assert around_init_req_state(original, None, admitted, None) == "state" and calls == [admitted]


@pytest.mark.parametrize("sampling, words", [
    ({"temperature": -1}, "temperature must be a non-negative finite number, got -1."),
    ({"top_p": 2}, "top_p must be in (0, 1], got 2."),
    ([{"temperature": 0}, {"min_p": 1.5}], "min_p must be in [0, 1], got 1.5."),
    ({"logit_bias": {"5000": 1.0}}, "logit_bias must has keys in [0, 1023], got 5000."),
])
def test_the_gate_refuses_invalid_sampling_parameters_in_sglangs_words(sampling, words):
    """The admission gate asks with the vocabulary size, before either side decides the room."""
    obj = _as_sent(input_ids=[[1, 2], [3]] if isinstance(sampling, list) else [1, 2], sampling_params=sampling)
    assert refusal_of(obj, vocab_size=1024) == words
    assert refusal_of(obj) is None  # the tokenizer hook leaves them to SGLang's own intake, which follows


@pytest.mark.parametrize("sampling", [
    {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True, "stop": ["x"], "regex": "(ab)+"},
    [{"temperature": 0.7, "top_p": 0.9, "top_k": -1}, {}],
    {"temperature": 0, "no_such_field": 1},  # SGLang's intake answers what it does not know
])
def test_the_gate_admits_valid_sampling_parameters(sampling):
    obj = _as_sent(input_ids=[[1, 2], [3]] if isinstance(sampling, list) else [1, 2], sampling_params=sampling)
    assert refusal_of(obj, vocab_size=1024) is None
