"""The reference model against NVIDIA nemo-automodel 0.7.0's DeepSeek-V4.1 (independent oracle):
random tiny checkpoints exported there with the released tensor names, loaded here."""

from __future__ import annotations

import pytest

from model.oracle_model import oracle_run
from sglang_asym.config import V41Config
from sglang_asym.layer_plan import LayerPlan, Role
from sglang_asym.model import V41Model

LENGTHS = (37, 300, 301)  # short, past the window, odd (a pending compressor tail)


@pytest.fixture(scope="module")
def oracle():
    return oracle_run(seed=3, seq_lens=LENGTHS)


def _model(weights, quant: str) -> V41Model:
    model = V41Model(V41Config.tiny(), cache_quant=quant)
    model.load_weights(weights)
    return model


def test_tiny_config_has_every_role():
    roles = {info.role for info in LayerPlan.from_config(V41Config.tiny()).layers}
    assert roles == set(Role)


def test_export_names_are_exactly_the_released_backbone(oracle):
    weights, _ = oracle
    assert set(weights) == set(LayerPlan.from_config(V41Config.tiny()).all_tensor_names)


@pytest.mark.parametrize("index", range(len(LENGTHS)))
def test_logits_match_without_cache_quantization(oracle, index):
    weights, cases = oracle
    case = cases[index]
    model = _model(weights, "none")
    cache = model.new_cache_set().new_request()
    logits = model(case.input_ids, cache, logits="all")
    assert logits.shape == case.logits_none.shape
    assert float(case.logits_none.abs().max()) > 0.5  # non-degenerate
    assert float((logits - case.logits_none).abs().max()) <= 1e-4


@pytest.mark.parametrize("index", range(len(LENGTHS)))
def test_logits_match_with_release_cache_quantization(oracle, index):
    """Equal except where a rounding landed on the other side of an FP4/FP8 boundary.

    A value within ~1e-7 of a 16-level FP4 boundary flips with any change of summation order, and
    the flipped cache row then nudges every later query that reads it (our own model moves the
    same way under a 1e-6 weight perturbation). Where the first flip lands depends on the CPU's
    summation order (on an AVX-512 EPYC, N=300 first flips at position 96 and 186 positions end up
    off by ~1.5e-4), so the test bounds the typical deviation instead of counting positions: the
    median position agrees to 1e-3 (a wrong quantization is off by ~0.1-0.5), large deviations stay
    isolated, nothing drifts, and the quantization itself is real (far from the exact-math logits)."""
    weights, cases = oracle
    case = cases[index]
    model = _model(weights, "release")
    logits = model(case.input_ids, model.new_cache_set().new_request(), logits="all")
    per_position = (logits - case.logits_release).abs().amax(-1)
    n = len(per_position)
    off = int((per_position > 1e-4).sum())
    large = int((per_position > 1e-2).sum())
    print(f"N={n}: {off} positions off by > 1e-4, {large} by > 1e-2, max {float(per_position.max()):.3g}")
    assert float(per_position.median()) <= 1e-3
    assert large <= max(1, 0.05 * n)
    assert float(per_position.max()) < 0.1
    quant_effect = (case.logits_release - case.logits_none).abs().amax(-1)
    assert float((quant_effect > 1e-3).float().mean()) > 0.9
