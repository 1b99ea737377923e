"""fake_quantize against NVIDIA's reference `quantize_cache`, run in .venv-oracle."""

from __future__ import annotations

import functools

import oracle_runner
import pytest
import torch

from sglang_asym.formats import fake_quantize

from .cases import input_cases

# the release's block sizes, and another one per format
FORMAT_BLOCKS = [("fp8", 32), ("fp8", 16), ("nvfp4", 16), ("nvfp4", 32), ("mxfp4", 32), ("mxfp4", 8)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Finite rows whose dequantized value overflows float32 in the reference (we refuse them)
OVERFLOW_ROWS = torch.tensor([[3.4e38, 1.0] * 16, [-3.3e38, 0.5] * 16], dtype=torch.float32)

ORACLE_SCRIPT = """
import sys
from safetensors.torch import load_file, save_file
from nemo_automodel.components.models.deepseek_v41.quantization import quantize_cache

FORMAT_BLOCKS = {format_blocks!r}
outputs = {{}}
for name, values in load_file(sys.argv[1]).items():
    for fmt, block in FORMAT_BLOCKS:
        outputs[f"{{fmt}}/{{block}}/{{name}}"] = quantize_cache(values, format=fmt, block_size=block).contiguous()
save_file(outputs, sys.argv[2])
""".format(format_blocks=FORMAT_BLOCKS)


def _inputs() -> dict[str, torch.Tensor]:
    inputs = {f"{case}/{dtype_name}": x.to(dtype) for case, x in input_cases().items() for dtype_name, dtype in DTYPES.items()}
    inputs["overflow/float32"] = OVERFLOW_ROWS
    return inputs


@functools.lru_cache(maxsize=1)
def _oracle_outputs() -> dict[str, torch.Tensor]:
    return oracle_runner.run_oracle(ORACLE_SCRIPT, _inputs())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("fmt,block", FORMAT_BLOCKS)
def test_bit_identical_to_oracle(fmt: str, block: int) -> None:
    oracle = _oracle_outputs()
    for name, values in _inputs().items():
        if name.startswith("overflow/"):
            continue
        expected = oracle[f"{fmt}/{block}/{name}"]
        ours = fake_quantize(values, fmt, block)
        assert ours.dtype == values.dtype and ours.shape == values.shape, name
        mismatch = _bits(ours) != _bits(expected)
        assert not mismatch.any(), (
            f"{fmt}/{block} {name}: {int(mismatch.sum())} elements differ, first at "
            f"{torch.nonzero(mismatch)[0].tolist()}: input {values[mismatch][0].item()!r}, "
            f"ours {ours[mismatch][0].item()!r}, oracle {expected[mismatch][0].item()!r}"
        )


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_refused_exactly_where_the_oracle_overflows(fmt: str) -> None:
    expected = _oracle_outputs()[f"{fmt}/32/overflow/float32"]
    assert torch.isinf(expected[0]).any() and torch.isinf(expected[1]).any()
    with pytest.raises(ValueError, match=rf"{fmt}: row 0 is too large"):
        fake_quantize(OVERFLOW_ROWS, fmt, 32)
    # nvfp4 saturates these rows instead (its e4m3 scale tops out at 448)
    nvfp4 = fake_quantize(OVERFLOW_ROWS, "nvfp4", 32)
    assert torch.equal(nvfp4, _oracle_outputs()["nvfp4/32/overflow/float32"])
    assert nvfp4[0, 0].item() == 2688.0 and nvfp4[1, 0].item() == -2688.0


def test_missing_oracle_venv_fails_with_setup_hint(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(oracle_runner, "ORACLE_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    with pytest.raises(oracle_runner.OracleError, match="run scripts/setup.sh"):
        oracle_runner.run_oracle("print('unreachable')", {"x": torch.zeros(1)})


def test_oracle_script_failure_is_reported() -> None:
    with pytest.raises(oracle_runner.OracleError, match="ZeroDivisionError"):
        oracle_runner.run_oracle("1 / 0", {"x": torch.zeros(1)})
