"""config.json's quantization_config: written at release precision (what SGLang needs to load block FP8),
absent at bf16 / fp32, kept by our own config loader, and added at most once."""

from __future__ import annotations

import json

import pytest

from sglang_asym.checkpoint import read_checkpoint_config, write_checkpoint
from sglang_asym.checkpoint.quantization import (
    RELEASE_QUANTIZATION_CONFIG,
    config_for_precision,
    quantization_config_of,
    with_release_quantization,
    without_quantization,
)
from sglang_asym.config import V41Config

from .ckpt_testlib import SEED

EXPECTED = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [32, 32],
            "activation_scheme": "dynamic"}


def test_release_config_json_carries_the_quantization_config(tiny_release_sharded, tiny_cfg):
    raw = json.loads((tiny_release_sharded / "config.json").read_text())
    assert raw["quantization_config"] == EXPECTED == RELEASE_QUANTIZATION_CONFIG
    assert "quantization_config" not in raw["text_config"]
    loaded = read_checkpoint_config(tiny_release_sharded)  # our loader keeps it as an unmodelled extra
    assert loaded == tiny_cfg and loaded.fingerprint() == tiny_cfg.fingerprint()
    assert quantization_config_of(loaded) == EXPECTED
    assert V41Config.from_json_file(tiny_release_sharded).to_hf_dict() == raw


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_float_checkpoints_claim_no_quantization(tmp_path, tiny_cfg, precision):
    # even from a config that carried one (e.g. read from a release checkpoint)
    write_checkpoint(tmp_path, with_release_quantization(tiny_cfg), SEED, precision=precision, progress=False)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in raw
    assert quantization_config_of(read_checkpoint_config(tmp_path)) is None


def test_adding_is_idempotent_and_keeps_a_present_config(tiny_cfg):
    once = with_release_quantization(tiny_cfg)
    assert with_release_quantization(once) is once
    assert json.loads(once.extra)["outer"] == {"quantization_config": EXPECTED}
    own = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    given = V41Config.from_hf_dict(dict(tiny_cfg.to_hf_dict(), quantization_config=own))
    assert with_release_quantization(given) is given and quantization_config_of(given) == own
    assert quantization_config_of(without_quantization(once)) is None
    assert without_quantization(tiny_cfg) is tiny_cfg


def test_unknown_precision_is_refused_before_writing(tmp_path, tiny_cfg):
    with pytest.raises(ValueError, match=r"precision must be one of \('release', 'bf16', 'fp32'\), got 'fp16'"):
        config_for_precision(tiny_cfg, "fp16")
    with pytest.raises(ValueError, match="precision must be one of"):
        write_checkpoint(tmp_path / "out", tiny_cfg, SEED, precision="fp16", progress=False)
    assert not (tmp_path / "out").exists()
