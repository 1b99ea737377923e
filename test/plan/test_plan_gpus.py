"""GPU specifications: the public figures the planner uses, aliases, and unknown GPUs refused."""

from __future__ import annotations

import pytest

from sglang_asym.footprint import GPU_MEMORY_BYTES
from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.gpus import GPUS, GpuSpec, gpu


def test_public_figures() -> None:
    h200, b300, gb200, gb300 = gpu("H200"), gpu("B300"), gpu("GB200"), gpu("gb300-nvl72")
    assert (h200.hbm_bytes, h200.hbm_bytes_per_s, h200.bf16_flops, h200.fp8_flops) == (141e9, 4.8e12, 0.989e15, 1.979e15)
    assert (b300.hbm_bytes, gb300.hbm_bytes, gb200.hbm_bytes) == (288e9, 288e9, 186e9)
    assert gb200.hbm_bytes_per_s == 8e12 and gb200.domain_gpus == gb300.domain_gpus == 72
    assert h200.domain_gpus == b300.domain_gpus == 8


def test_memory_agrees_with_footprint() -> None:
    for name, capacity in GPU_MEMORY_BYTES.items():
        assert gpu(name).hbm_bytes == capacity


def test_unknown_gpu() -> None:
    with pytest.raises(PlanInputError, match=r"unknown GPU 'A100'; choose one of \['B200', 'B300', 'GB200-NVL72', 'GB300-NVL72', 'H100'"):
        gpu("A100")
    with pytest.raises(PlanInputError, match="must be a string"):
        gpu(None)


def test_spec_validation() -> None:
    with pytest.raises(PlanInputError, match="hbm_bytes_per_s must be > 0"):
        GpuSpec("x", 1, -1, 1, 1, 1, 1, 1, 8, "")
    with pytest.raises(PlanInputError, match="domain_gpus"):
        GpuSpec("x", 1, 1, 1, 1, 1, 1, 1, 0, "")
    assert sorted(GPUS) == ["B200", "B300", "GB200-NVL72", "GB300-NVL72", "H100", "H200", "H800"]


def test_added_gpus_public_figures() -> None:
    h100, h800, b200 = gpu("H100"), gpu("h800-sxm"), gpu("B200")
    assert (h100.hbm_bytes, h100.hbm_bytes_per_s, h100.bf16_flops, h100.fp8_flops) == (80e9, 3.35e12, 0.989e15, 1.979e15)
    assert (h100.nvlink_bytes_per_s, h800.nvlink_bytes_per_s) == (450e9, 200e9)  # one direction: 900 / 400 GB/s both
    assert (h800.hbm_bytes, h800.hbm_bytes_per_s, h800.fp8_flops) == (h100.hbm_bytes, h100.hbm_bytes_per_s, h100.fp8_flops)
    assert (b200.hbm_bytes, b200.hbm_bytes_per_s, b200.bf16_flops, b200.fp8_flops, b200.fp4_flops) == \
        (180e9, 8e12, 2.25e15, 4.5e15, 9e15)
    assert b200.domain_gpus == h100.domain_gpus == 8
