"""scripts/distill_drafter.py end to end at a toy size: trains, measures acceptance, writes mtp.* tensors.

Acceptance is measured before and after on held-out prompts; the output loads back into the drafter."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from sglang_asym.checkpoint import write_checkpoint
from sglang_asym.config import V41Config
from sglang_asym.model.dspark import DSparkDrafter

from .helpers import target

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "distill_drafter.py"
TOY = ["--seed", "0", "--steps", "3", "--train-prompts", "2", "--eval-prompts", "1", "--new-tokens", "6",
       "--anchors", "4", "--k", "3"]


def load_script():
    if "distill_drafter" not in sys.modules:  # dataclasses need the module registered
        spec = importlib.util.spec_from_file_location("distill_drafter", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["distill_drafter"] = module
        spec.loader.exec_module(module)
    return sys.modules["distill_drafter"]


def run(args: list[str], capsys) -> dict:
    assert load_script().main(args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_distill_from_preset(tmp_path, capsys):
    out = tmp_path / "draft.safetensors"
    report = run(["--config", "tiny", *TOY, "--out", str(out)], capsys)
    assert report["init"] == "random" and report["steps"] == 3 and report["k"] == 3
    for key in ("acceptance_before", "acceptance_after"):
        stats = report[key]
        assert stats["emitted"] == 5 and stats["steps"] == stats["emitted"] - stats["accepted"]
        assert len(stats["per_position_acceptance"]) == 3
    saved = load_file(str(out))
    drafter = DSparkDrafter(target())
    assert set(saved) == drafter.expected_tensor_names()
    drafter.load_weights(saved)  # loads back under the released names


@pytest.mark.parametrize("with_draft", [True, False])
def test_distill_from_checkpoint_directory(tmp_path, capsys, with_draft):
    write_checkpoint(tmp_path / "ckpt", V41Config.tiny(), 0, precision="fp32", num_shards=1,
                     include_extras=with_draft, progress=False)
    report = run(["--model-path", str(tmp_path / "ckpt"), *TOY, "--out", str(tmp_path / "d.safetensors")], capsys)
    assert report["init"] == ("checkpoint" if with_draft else "random")
    assert report["tensors"] == len(load_file(str(tmp_path / "d.safetensors")))


@pytest.mark.parametrize("args, message", [
    (["--config", "tiny", "--seed", "0", "--steps", "0", "--out", "x.safetensors"], "--steps must be at least 1"),
    (["--config", "tiny", "--seed", "0", "--steps", "1", "--out", "x.bin"], "must be a .safetensors file"),
    (["--config", "tiny", "--seed", "0", "--steps", "1", "--out", "x.safetensors", "--k", "6",
      "--train-prompts", "1", "--eval-prompts", "1", "--new-tokens", "2"], r"--k must be in \[1, 5\]"),
])
def test_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit):
        load_script().main(args)
    assert message.replace("\\", "") in capsys.readouterr().err
