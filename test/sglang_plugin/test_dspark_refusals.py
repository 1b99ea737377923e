"""What a DSpark server on the CPU engine refuses at the launcher (cpu_patches.refuse_sampled_speculation, run by
the _validate_one_request hook, whose ValueError SGLang answers with a 400): sampled and constrained requests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_asym.sglang_plugin.cpu_platform.patches import refuse_sampled_speculation


def _manager(algorithm):
    return SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm=algorithm))


@pytest.mark.parametrize("params", [{"temperature": 0}, {"temperature": 0.8, "top_k": 1}, [{"temperature": 0}] * 2])
def test_greedy_requests_pass(params):
    refuse_sampled_speculation(_manager("DSPARK"), SimpleNamespace(sampling_params=params))


@pytest.mark.parametrize("params, message", [
    ({}, r"greedy requests only: send temperature 0 \(got temperature 1.0, top_k -1\)"),
    ([{"temperature": 0}, {"temperature": 0.5, "top_k": 4}], r"\(got temperature 0.5, top_k 4\)"),
    ({"temperature": 0, "regex": "[ab]+"}, r"does not serve constrained decoding \(regex\)"),
    ({"temperature": 0, "json_schema": "{}", "ebnf": "x"}, r"constrained decoding \(json_schema, ebnf\)"),
])
def test_sampled_and_constrained_requests_are_refused(params, message):
    with pytest.raises(ValueError, match=message):
        refuse_sampled_speculation(_manager("DSPARK"), SimpleNamespace(sampling_params=params))


def test_servers_without_dspark_refuse_nothing():
    refuse_sampled_speculation(_manager(None), SimpleNamespace(sampling_params={"temperature": 0.9, "regex": "x"}))
    refuse_sampled_speculation(_manager("EAGLE"), SimpleNamespace(sampling_params={"temperature": 0.9}))
