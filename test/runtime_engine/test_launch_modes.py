"""The launch CLI's mode wiring: each --disaggregation-mode gets its default semantics, exact is served by
null / prefill / decode only, and a mismatch is a clear error before any model is loaded."""

from __future__ import annotations

import pytest

from sglang_asym import launch_server
from sglang_asym.runtime.engine import disaggregated
from sglang_asym.runtime.engine.options import EngineOptions


def _validated(tmp_path, *flags):
    args = launch_server.build_parser().parse_args(["--model-path", str(tmp_path), *flags])
    launch_server.validate(args)
    return args


@pytest.mark.parametrize("mode, semantics", [("null", "asym-exact-encoder"), ("asym-prefill", "asym-exact-encoder"),
                                             ("asym-decode", "asym-exact-encoder"), ("prefill", "exact"),
                                             ("decode", "exact")])
def test_default_semantics_per_mode(tmp_path, mode, semantics):
    args = _validated(tmp_path, "--disaggregation-mode", mode)
    assert args.asym_semantics == semantics
    assert launch_server.engine_options(args).semantics.value == semantics


def test_exact_is_accepted_where_it_can_be_computed(tmp_path):
    assert _validated(tmp_path, "--asym-semantics", "exact").asym_semantics == "exact"
    assert _validated(tmp_path, "--disaggregation-mode", "decode", "--asym-semantics", "exact").asym_semantics == "exact"


@pytest.mark.parametrize("mode, semantics, fragment", [
    ("asym-prefill", "exact", "cannot be split"),
    ("asym-decode", "exact", "cannot be split"),
    ("prefill", "asym", "symmetric PD"),
    ("decode", "asym-exact-encoder", "symmetric PD"),
])
def test_a_mode_semantics_mismatch_is_refused(tmp_path, capsys, mode, semantics, fragment):
    with pytest.raises(SystemExit, match=fragment):
        _validated(tmp_path, "--disaggregation-mode", mode, "--asym-semantics", semantics)
    with pytest.raises(SystemExit, match=fragment):  # the engine factory checks too, before loading anything
        disaggregated.build(mode, str(tmp_path), EngineOptions(model_path=str(tmp_path), semantics=semantics))


def test_build_refuses_a_non_disaggregated_mode(tmp_path):
    with pytest.raises(SystemExit, match="not a disaggregated mode"):
        disaggregated.build("null", str(tmp_path), EngineOptions(model_path=str(tmp_path)))
