"""sampling_params parsing: SGLang names mapped, neutral-only features, unknown keys, context filling."""

from __future__ import annotations

import pytest

from sglang_asym.runtime.engine_api import SamplingParams
from sglang_asym.runtime.http.errors import ApiError
from sglang_asym.runtime.http.sampling import parse_sampling


def resolve(raw, prompt_len=10, context=100) -> SamplingParams:
    return parse_sampling(raw).resolve(prompt_len, context)


def test_sglang_names_map_to_engine_fields():
    params = resolve({"max_new_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 4, "sampling_seed": 11,
                      "stop_token_ids": [2, 3], "ignore_eos": True})
    assert params == SamplingParams(max_new_tokens=7, temperature=0, top_p=0.5, top_k=4, seed=11,
                                    stop_token_ids=(2, 3), ignore_eos=True)


def test_defaults_none_values_and_top_k_off():
    assert resolve(None) == SamplingParams(max_new_tokens=128)
    assert resolve({"temperature": None, "top_k": None}) == SamplingParams(max_new_tokens=128)
    assert resolve({"top_k": 1 << 30}).top_k == -1  # SGLang's spelling of "no top-k"


def test_null_max_new_tokens_fills_the_context():
    assert resolve({"max_new_tokens": None}, prompt_len=30, context=100).max_new_tokens == 70


def test_front_flags_are_kept_apart_from_the_engine():
    parsed = parse_sampling({"skip_special_tokens": False, "no_stop_trim": True})
    assert (parsed.skip_special_tokens, parsed.no_stop_trim) == (False, True)
    assert parsed.engine_fields == {}


def test_neutral_values_of_unimplemented_features_are_accepted():
    raw = {"min_p": 0.0, "frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "n": 1,
           "stop": [], "regex": None, "spaces_between_special_tokens": True, "stream_interval": 4, "logit_bias": {}}
    assert resolve(raw) == SamplingParams(max_new_tokens=128)


@pytest.mark.parametrize("raw, message", [
    ({"min_p": 0.1}, "sampling_params.min_p=0.1 is not supported by this runtime"),
    ({"n": 2}, "sampling_params.n=2 is not supported by this runtime"),
    ({"stop": ["\n"]}, "sampling_params.stop=['\\n'] is not supported by this runtime"),
    ({"repetition_penalty": 1.1}, "sampling_params.repetition_penalty=1.1 is not supported"),
    ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens=False is not supported"),
    ({"foo": 1}, "sampling_params: unknown field `foo`, expected one of `max_new_tokens`"),
    ({"max_new_tokens": -1}, "sampling_params: max_new_tokens must be in [0, 1048576], got -1"),
    ({"max_new_tokens": 10**9}, "sampling_params: max_new_tokens must be in [0, 1048576], got 1000000000"),
    ({"max_new_tokens": "5"}, "sampling_params.max_new_tokens must be an integer, got '5'"),
    ({"temperature": -1}, "sampling_params: temperature must be >= 0, got -1"),
    ({"top_p": 0}, "sampling_params: top_p must be in (0, 1], got 0"),
    ({"ignore_eos": "yes"}, "sampling_params: ignore_eos must be a boolean, got 'yes'"),
    ({"skip_special_tokens": 1}, "sampling_params.skip_special_tokens must be a boolean, got 1"),
    ([1, 2], "sampling_params must be an object, got list"),
])
def test_rejections_are_400_and_name_the_field(raw, message):
    with pytest.raises(ApiError) as info:
        parse_sampling(raw)
    assert info.value.status == 400
    assert message in info.value.message
