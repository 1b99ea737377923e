"""The engine boundary's typed messages: validation with clear errors, SGLang's finish_reason shapes."""

from __future__ import annotations

import pytest

from sglang_asym.runtime.engine_api import (
    FAKE_BOOTSTRAP_HOST,
    MAX_NEW_TOKENS_LIMIT,
    BootstrapInfo,
    EngineClient,
    EngineRole,
    FinishKind,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    TokenEvent,
)

from .fakes import FakeEngine


def test_sampling_defaults_and_greedy():
    params = SamplingParams()
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k) == (128, 1.0, 1.0, -1)
    assert params.seed is None and params.stop_token_ids == () and params.ignore_eos is False
    assert not params.is_greedy
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(top_k=1).is_greedy


def test_sampling_stop_token_ids_become_a_tuple():
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": -1}, "max_new_tokens must be in [0, 1048576], got -1"),
    ({"max_new_tokens": MAX_NEW_TOKENS_LIMIT + 1}, "max_new_tokens must be in [0, 1048576], got 1048577"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer, got 2.5"),
    ({"max_new_tokens": True}, "max_new_tokens must be an integer, got True"),
    ({"temperature": -0.1}, "temperature must be >= 0, got -0.1"),
    ({"temperature": float("nan")}, "temperature must be a finite number, got nan"),
    ({"temperature": "hot"}, "temperature must be a finite number, got 'hot'"),
    ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ({"top_k": 0}, "top_k must be -1 (disabled) or a positive integer, got 0"),
    ({"top_k": -2}, "top_k must be -1 (disabled) or a positive integer, got -2"),
    ({"seed": 1 << 64}, "seed must be a 64-bit integer or null"),
    ({"stop_token_ids": [1, -3]}, "stop_token_ids must be non-negative integers, got -3"),
    ({"stop_token_ids": 7}, "stop_token_ids must be a list of token ids, got 7"),
    ({"ignore_eos": 1}, "ignore_eos must be a boolean, got 1"),
])
def test_sampling_rejects_bad_values_by_name(kwargs, message):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert message in str(info.value)


def test_bootstrap_info_validation_and_health_probe_marker():
    assert BootstrapInfo("127.0.0.1", 8998, (1 << 63) - 1).room == (1 << 63) - 1
    assert BootstrapInfo(FAKE_BOOTSTRAP_HOST, None, 0).is_health_probe
    assert not BootstrapInfo("127.0.0.1", None, 0).is_health_probe
    with pytest.raises(ValueError, match=r"bootstrap_room must be an integer in \[0, 2\^63\), got 9223372036854775808"):
        BootstrapInfo("h", 1, 1 << 63)
    with pytest.raises(ValueError, match="bootstrap_room must be an integer"):
        BootstrapInfo("h", 1, "7")
    with pytest.raises(ValueError, match="bootstrap_port must be an integer in"):
        BootstrapInfo("h", 70000, 1)
    with pytest.raises(ValueError, match="bootstrap_host must be a non-empty string"):
        BootstrapInfo("", 1, 1)


def test_generate_request_validation():
    req = GenerateRequest("r1", [5, 6], SamplingParams())
    assert req.input_ids == (5, 6) and req.bootstrap is None and req.stream is False
    with pytest.raises(ValueError, match="request r1: input_ids is empty"):
        GenerateRequest("r1", [], SamplingParams())
    with pytest.raises(ValueError, match="input_ids must be non-negative integers"):
        GenerateRequest("r1", [1, -1], SamplingParams())
    with pytest.raises(ValueError, match="rid must be a non-empty string"):
        GenerateRequest("", [1], SamplingParams())


def test_finish_reason_json_matches_sglang():
    assert FinishReason.stop(7).to_json() == {"type": "stop", "matched": 7}
    assert FinishReason.of_length(0).to_json() == {"type": "length", "length": 0}
    assert FinishReason.abort("gone").to_json() == {"type": "abort", "message": "gone"}
    assert FinishReason.abort().to_json() == {"type": "abort", "message": "Aborted"}
    assert FinishReason.of_length(3).kind is FinishKind.LENGTH


def test_token_event_consistency():
    event = TokenEvent("r", [1, 2])
    assert event.new_token_ids == (1, 2) and not event.finished and event.meta == {}
    with pytest.raises(ValueError, match="finish_reason must come with finished=True"):
        TokenEvent("r", (), True)
    with pytest.raises(ValueError, match="finish_reason must come with finished=True"):
        TokenEvent("r", (), False, FinishReason.stop(1))
    with pytest.raises(ValueError, match="an event with an error must be the final one"):
        TokenEvent("r", (), False, None, "boom")


def test_roles():
    assert [r.value for r in EngineRole] == ["null", "prefill", "decode"]
    assert not EngineRole.COLOCATED.requires_bootstrap
    assert EngineRole.PREFILL.requires_bootstrap and EngineRole.DECODE.requires_bootstrap


def test_fake_engine_satisfies_the_protocol(tokenizer):
    assert isinstance(FakeEngine(tokenizer), EngineClient)
    assert not isinstance(object(), EngineClient)
