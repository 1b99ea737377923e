"""`python -m sglang_asym.logits` on a checkpoint directory exported by NVIDIA's implementation."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from model.oracle_model import oracle_run
from sglang_asym.config import V41Config

LENGTHS = (37, 300, 301)


def _write_checkpoint(directory, weights, drop: str | None = None):
    V41Config.tiny().write_json(directory)
    save_file({k: v.contiguous() for k, v in weights.items() if k != drop}, str(directory / "model.safetensors"))


def _run(*args):
    return subprocess.run([sys.executable, "-m", "sglang_asym.logits", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_cli_logits_equal_the_oracle(tmp_path):
    weights, cases = oracle_run(seed=3, seq_lens=LENGTHS)
    _write_checkpoint(tmp_path, weights)
    case = cases[2]  # odd length, past the window
    save_file({"ids": case.input_ids.unsqueeze(0).repeat(2, 1).contiguous()}, str(tmp_path / "in.safetensors"))
    proc = _run("--model-path", tmp_path, "--input-ids", tmp_path / "in.safetensors", "--key", "ids",
                "--out", tmp_path / "out.safetensors")
    assert proc.returncode == 0, proc.stderr
    logits = load_file(str(tmp_path / "out.safetensors"))["logits"]
    assert logits.shape == (2, 301, V41Config.tiny().vocab_size) and logits.dtype == torch.float32
    assert float((logits[0] - case.logits_none).abs().max()) <= 1e-4
    assert torch.equal(logits[0], logits[1])


def test_cli_errors_name_the_problem(tmp_path):
    weights, cases = oracle_run(seed=3, seq_lens=LENGTHS)
    _write_checkpoint(tmp_path, weights, drop="layers.3.attn.compressor.wkv.weight")
    save_file({"ids": cases[0].input_ids.unsqueeze(0)}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    proc = _run("--model-path", tmp_path, "--input-ids", tmp_path / "in.safetensors", "--key", "nope", "--out", out)
    assert proc.returncode == 2 and "no tensor 'nope'" in proc.stderr
    proc = _run("--model-path", tmp_path, "--input-ids", tmp_path / "in.safetensors", "--key", "ids", "--out", out)
    assert proc.returncode == 2 and "layers.3.attn.compressor.wkv.weight" in proc.stderr
    assert not out.exists()
    save_file({"ids": torch.tensor([[5, 100000]])}, str(tmp_path / "bad.safetensors"))
    _write_checkpoint(tmp_path, weights)
    proc = _run("--model-path", tmp_path, "--input-ids", tmp_path / "bad.safetensors", "--key", "ids", "--out", out)
    assert proc.returncode == 2 and "token id 100000" in proc.stderr
