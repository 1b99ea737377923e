"""The prefill role reads exactly its tensors (+ scales) and opens only their shards (spied reads).

Exactly LayerPlan.prefill_tensor_names and the shards holding them, observed by spying on
safetensors.safe_open as the reader calls it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import sglang_asym.checkpoint.reader as reader_module
from sglang_asym.checkpoint import CheckpointReader, scale_name, write_checkpoint
from sglang_asym.config import V41Config
from sglang_asym.layer_plan import LayerPlan
from sglang_asym.tensor_specs import backbone_tensor_specs

from .ckpt_testlib import SEED


class SafetensorsSpy:
    """Wraps safe_open: records every file opened and every tensor whose data is read."""

    def __init__(self, real):
        self.real = real
        self.opened: list[str] = []
        self.tensors_read: list[str] = []

    def __call__(self, path, framework, **kwargs):
        spy = self

        class Handle:
            def __init__(self):
                self.inner = spy.real(path, framework=framework, **kwargs)

            def __enter__(self):
                self.inner.__enter__()
                spy.opened.append(Path(path).name)
                return self

            def __exit__(self, *exc):
                return self.inner.__exit__(*exc)

            def keys(self):
                return self.inner.keys()

            def get_slice(self, name):
                return self.inner.get_slice(name)  # header only: shape and dtype

            def get_tensor(self, name):
                spy.tensors_read.append(name)
                return self.inner.get_tensor(name)

        return Handle()


def expected_reads(directory: Path, names: frozenset[str]) -> tuple[set[str], set[str]]:
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    with_scales = set(names) | {scale_name(n) for n in names if n.endswith(".weight") and scale_name(n) in weight_map}
    return with_scales, {weight_map[n] for n in with_scales}


def spy_on_load(monkeypatch, directory: Path, role: str):
    reader = CheckpointReader(directory)  # reading the index opens nothing
    spy = SafetensorsSpy(reader_module.safe_open)
    monkeypatch.setattr(reader_module, "safe_open", spy)
    weights = reader.load(role=role, progress=False)
    return reader, spy, weights


def test_tiny_prefill_reads_exactly_its_tensors(monkeypatch, tiny_release_sharded, tiny_cfg):
    plan = LayerPlan.from_config(tiny_cfg)
    reader, spy, weights = spy_on_load(monkeypatch, tiny_release_sharded, "prefill")
    tensors, files = expected_reads(tiny_release_sharded, plan.prefill_tensor_names)
    assert set(weights) == plan.prefill_tensor_names
    assert len(spy.tensors_read) == len(set(spy.tensors_read))  # nothing read twice
    assert set(spy.tensors_read) == tensors
    assert sorted(spy.opened) == sorted(files) == ["model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors"]
    assert reader.stats.tensors_read == len(tensors) and reader.stats.shards_opened == tuple(sorted(files))


@pytest.fixture(scope="module")
def small_release(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("small_release")
    write_checkpoint(out, V41Config.small(), SEED, precision="release", num_shards=9, progress=False)
    return out


def test_small_prefill_skips_decoder_and_draft_shards(monkeypatch, small_release):
    cfg = V41Config.small()
    plan = LayerPlan.from_config(cfg)
    reader, spy, weights = spy_on_load(monkeypatch, small_release, "prefill")
    tensors, files = expected_reads(small_release, plan.prefill_tensor_names)
    assert set(spy.tensors_read) == tensors and len(spy.tensors_read) == len(tensors)
    assert sorted(spy.opened) == sorted(files) == [f"model-0000{i}-of-00009.safetensors" for i in range(1, 5)]
    # byte accounting: what the reader reports is what the spy saw, and about half the backbone
    stored = json.loads((small_release / "model.safetensors.index.json").read_text())
    assert reader.stats.bytes_read < 0.51 * stored["metadata"]["total_size"]
    specs = {s.name: s for s in backbone_tensor_specs(cfg)}
    assert sum(specs[n].numel for n in weights) == sum(t.numel() for t in weights.values())
    assert "layers.20.attn.compressor.wkv.weight" in weights and "layers.20.attn.wq_a.weight" not in weights
    assert not any(n.startswith(("layers.21.", "layers.39.", "head.", "norm.")) for n in spy.tensors_read)


def test_small_decode_reads_backbone_but_not_draft(monkeypatch, small_release):
    plan = LayerPlan.from_config(V41Config.small())
    reader, spy, weights = spy_on_load(monkeypatch, small_release, "decode")
    assert set(weights) == set(plan.all_tensor_names)
    assert "model-00009-of-00009.safetensors" not in spy.opened and len(spy.opened) == 8
    assert not any(n.startswith("mtp.") for n in spy.tensors_read)
