"""Every bad input raises CheckpointError naming the file and the tensor."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from sglang_asym.checkpoint import CheckpointError, CheckpointReader, load_weights, write_checkpoint

from .ckpt_testlib import SEED, copy_checkpoint, index_of, rewrite_shard, write_index

WQ_A = "layers.1.attn.wq_a.weight"  # prefill-role fp8 weight
EXPERT = "layers.2.ffn.experts.0.w1.weight"  # prefill-role fp4 weight
NORM = "layers.0.attn_norm.weight"  # bf16


@pytest.fixture
def ckpt(tmp_path, tiny_release_sharded) -> Path:
    return copy_checkpoint(tiny_release_sharded, tmp_path / "ckpt")


def shard_of(directory: Path, name: str) -> str:
    return index_of(directory)["weight_map"][name]


def raises(match: str):
    return pytest.raises(CheckpointError, match=match)


def test_missing_shard_file(ckpt):
    shard = shard_of(ckpt, WQ_A)
    (ckpt / shard).unlink()
    with raises(rf"{re.escape(str(ckpt / shard))}: shard file missing; model.safetensors.index.json maps tensor 'embed.weight' there"):
        load_weights(ckpt, role="prefill", progress=False)


def test_tensor_missing_for_role(ckpt):
    original = index_of(ckpt)
    index = index_of(ckpt)
    del index["weight_map"][WQ_A]
    write_index(ckpt, index)
    with raises(rf"{re.escape(str(ckpt / 'model.safetensors.index.json'))}: tensor '{WQ_A}' needed by the prefill "
                r"role is missing from the checkpoint"):
        load_weights(ckpt, role="prefill", progress=False)
    # a decoder-only tensor missing does not bother the prefill role, only the decode role
    index = original
    del index["weight_map"]["layers.7.attn.wq_a.weight"]
    write_index(ckpt, index)
    assert WQ_A in load_weights(ckpt, role="prefill", progress=False)
    with raises(r"tensor 'layers.7.attn.wq_a.weight' needed by the decode role is missing"):
        load_weights(ckpt, role="decode", progress=False)


def test_index_maps_tensor_to_a_shard_without_it(ckpt):
    shard = shard_of(ckpt, NORM)
    rewrite_shard(ckpt, shard, lambda t: t.pop(NORM))
    with raises(rf"{re.escape(str(ckpt / shard))}: tensor '{NORM}' is absent although model.safetensors.index.json maps it"):
        load_weights(ckpt, [NORM], progress=False)


def test_shape_mismatch(ckpt):
    shard = shard_of(ckpt, NORM)
    rewrite_shard(ckpt, shard, lambda t: t.__setitem__(NORM, torch.ones(63, dtype=torch.bfloat16)))
    with raises(rf"{re.escape(str(ckpt / shard))}: tensor '{NORM}' has shape \[63\], expected \[64\] for this config"):
        load_weights(ckpt, role="prefill", progress=False)


def test_packed_shape_mismatch(ckpt):
    shard = shard_of(ckpt, EXPERT)
    rewrite_shard(ckpt, shard, lambda t: t.__setitem__(EXPERT, torch.zeros(32, 64, dtype=torch.int8)))
    with raises(rf"tensor '{EXPERT}' has torch.int8 shape \[32, 64\], expected \[32, 32\] \(fp4 of logical shape \[32, 64\]\)"):
        load_weights(ckpt, [EXPERT], progress=False)


def test_fp8_weight_without_scale(ckpt):
    index = index_of(ckpt)
    del index["weight_map"]["layers.1.attn.wq_a.scale"]
    write_index(ckpt, index)
    with raises(rf"tensor '{WQ_A}' is torch.float8_e4m3fn but its scale tensor 'layers.1.attn.wq_a.scale' is missing"):
        load_weights(ckpt, role="prefill", progress=False)


def test_wrong_scale_shape(ckpt):
    scale = "layers.2.ffn.experts.0.w1.scale"
    shard = shard_of(ckpt, scale)
    rewrite_shard(ckpt, shard, lambda t: t.__setitem__(scale, t[scale][:, :1].contiguous()))
    with raises(rf"{re.escape(str(ckpt / shard))}: scale '{scale}' of '{EXPERT}' is torch.float8_e8m0fnu \[32, 1\], "
                r"expected float8_e8m0fnu \[32, 2\]"):
        load_weights(ckpt, role="prefill", progress=False)


def test_wrong_scale_dtype(ckpt):
    scale = "layers.1.attn.wq_a.scale"
    rewrite_shard(ckpt, shard_of(ckpt, scale), lambda t: t.__setitem__(scale, t[scale].float()))
    with raises(rf"scale '{scale}' of '{WQ_A}' is torch.float32 \[1, 2\], expected float8_e8m0fnu \[1, 2\]"):
        load_weights(ckpt, [WQ_A], progress=False)


def test_nan_scale(ckpt):
    scale = "layers.2.ffn.experts.0.w1.scale"
    shard = shard_of(ckpt, scale)

    def poison(t):
        raw = t[scale].view(torch.uint8).clone()
        raw[3, 1] = 0xFF
        t[scale] = raw.view(torch.float8_e8m0fnu)
    rewrite_shard(ckpt, shard, poison)
    with raises(rf"{re.escape(str(ckpt / shard))}: scale '{scale}' of '{EXPERT}': scale holds the e8m0 NaN encoding 0xFF"):
        load_weights(ckpt, [EXPERT], progress=False)


def test_quantized_storage_where_release_has_bf16(ckpt):
    def to_fp8(t):
        t[NORM] = t[NORM].float().to(torch.float8_e4m3fn)
    rewrite_shard(ckpt, shard_of(ckpt, NORM), to_fp8)
    with raises(rf"tensor '{NORM}' is stored as torch.float8_e4m3fn, but the released format stores it as bf16"):
        load_weights(ckpt, [NORM], progress=False)


def test_scale_beside_unquantized_weight(ckpt):
    def dequantized(t):
        t[WQ_A] = t[WQ_A].to(torch.bfloat16)
    rewrite_shard(ckpt, shard_of(ckpt, WQ_A), dequantized)
    with raises(rf"tensor '{WQ_A}' is stored as torch.bfloat16 but has a scale tensor 'layers.1.attn.wq_a.scale'"):
        load_weights(ckpt, [WQ_A], progress=False)


def test_unsupported_stored_dtype(ckpt):
    rewrite_shard(ckpt, shard_of(ckpt, NORM), lambda t: t.__setitem__(NORM, torch.zeros(64, dtype=torch.int32)))
    with raises(rf"tensor '{NORM}' has unsupported dtype I32"):
        load_weights(ckpt, [NORM], progress=False)


def test_config_that_is_not_v41(ckpt):
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with raises(rf"{re.escape(str(ckpt / 'config.json'))}: config.json has model_type 'llama'"):
        CheckpointReader(ckpt)
    (ckpt / "config.json").write_text("{not json")
    with raises(rf"{re.escape(str(ckpt / 'config.json'))}: Expecting property name"):
        CheckpointReader(ckpt)
    (ckpt / "config.json").unlink()
    with raises(r"config.json: no config.json in the checkpoint directory"):
        CheckpointReader(ckpt)


def test_bad_index_and_missing_weights(ckpt, tmp_path):
    (ckpt / "model.safetensors.index.json").write_text('{"weight_map": [1, 2]}')
    with raises(r"model.safetensors.index.json: needs a \"weight_map\" object"):
        CheckpointReader(ckpt)
    (ckpt / "model.safetensors.index.json").write_text("[")
    with raises(r"model.safetensors.index.json: not valid JSON"):
        CheckpointReader(ckpt)
    (ckpt / "model.safetensors.index.json").unlink()
    with raises(r"neither model.safetensors.index.json nor model.safetensors found"):
        CheckpointReader(ckpt)
    with raises(r"checkpoint directory does not exist"):
        CheckpointReader(tmp_path / "nowhere")


def test_corrupt_shard(ckpt):
    shard = shard_of(ckpt, NORM)
    (ckpt / shard).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    with raises(rf"{re.escape(str(ckpt / shard))}: cannot open as safetensors"):
        load_weights(ckpt, [NORM], progress=False)


def test_single_file_missing_tensor(tmp_path, tiny_cfg):
    write_checkpoint(tmp_path, tiny_cfg, SEED, num_shards=1, progress=False)
    rewrite_shard(tmp_path, "model.safetensors", lambda t: t.pop("head.weight"))
    assert "head.weight" not in load_weights(tmp_path, role="prefill", progress=False)
    with raises(rf"{re.escape(str(tmp_path / 'model.safetensors'))}: tensor 'head.weight' needed by the decode role is missing"):
        load_weights(tmp_path, role="decode", progress=False)


def test_bad_requests(ckpt):
    reader = CheckpointReader(ckpt)
    with raises(r"tensor 'layers.99.attn.wq_a.weight' is not a DeepSeek-V4.1 checkpoint tensor for this config"):
        reader.load(["layers.99.attn.wq_a.weight"], progress=False)
    with raises(r"pass either names or role, not both"):
        reader.load([NORM], role="prefill", progress=False)
    with raises(r"unknown role 'verify'"):
        reader.load(role="verify", progress=False)
    with raises(r"dtype must be a float dtype"):
        reader.load([NORM], dtype=torch.int8, progress=False)


def test_unknown_extra_tensors_are_ignored_with_debug_log(ckpt, caplog):
    extras = {
        "mtp.0.attn.wq_a.weight": torch.zeros(4, 4, dtype=torch.bfloat16),
        "layers.1.engram.embed.weight": torch.zeros(4, 256, dtype=torch.bfloat16),
        "vision.blocks.0.attn.wqkv.weight": torch.zeros(2, 2),
    }
    save_file(extras, str(ckpt / "extras.safetensors"))
    index = index_of(ckpt)
    index["weight_map"].update(dict.fromkeys(extras, "extras.safetensors"))
    write_index(ckpt, index)
    reader = CheckpointReader(ckpt)
    with caplog.at_level(logging.DEBUG, logger="sglang_asym.checkpoint.reader"):
        weights = reader.load(progress=False)
    assert not set(extras) & set(weights)
    assert "extras.safetensors" not in reader.stats.shards_opened
    assert any("skipping" in r.message and "layers.1.engram.embed.weight" in r.message for r in caplog.records)
