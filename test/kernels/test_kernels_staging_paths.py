"""The staging copy paths of the transfer layer (transfer/staging.py): numpy, sgl_kernel_ext's torch
reference and its Triton kernel (interpreted on CPU) give the same bytes for P's gather into a staging
extent and D's scatter into pool slots; the mode comes from the caller or $SGLANG_ASYM_STAGING_COPY
and a bad one is refused by name; bad slots are refused on every path before anything is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sgl_kernel_ext import KernelInputError
from sglang_asym.manifest import PayloadManifest, RowGroup
from sglang_asym.transfer.extents import BLOCK, ExtentBuffer
from sglang_asym.transfer.row_pool import RowPool
from sglang_asym.transfer.staging import COPY_ENV, StagingExtent, copy_mode, gather_rows, scatter_rows

MODES = ("numpy", "torch", "triton")


def _pool(seed: int) -> RowPool:
    return RowPool("L20.kv", torch.randint(0, 256, (300, 288), dtype=torch.uint8,
                                           generator=torch.Generator().manual_seed(seed)))


def test_copy_in_is_the_same_on_every_path() -> None:
    pool = _pool(0)
    slots = np.concatenate([np.arange(40, 90), np.array([3, 299, 0]), np.arange(120, 130)])
    manifest = PayloadManifest((RowGroup("L2.index", 68, 5), RowGroup("L20.kv", 288, len(slots))))
    results = []
    for mode in MODES:
        buffer = ExtentBuffer("staging", 1 << 16)
        buffer.reserve(BLOCK * 3)                            # the room's extent does not start at 0
        extent = StagingExtent.reserve(buffer, manifest, copy=mode)
        assert extent.copy == mode
        extent.copy_in(pool, "L20.kv", slots, 0, 20)
        extent.copy_in(pool, "L20.kv", slots, 20, len(slots))
        rows = extent.rows("L20.kv", 288, 0, len(slots))
        assert np.array_equal(rows, pool.array[slots])
        results.append(buffer.pool.array.copy())
    assert all(np.array_equal(r, results[0]) for r in results)


@pytest.mark.parametrize("mode", MODES)
def test_scatter_rows_writes_exactly_the_slots(mode: str) -> None:
    pool = _pool(1)
    before = pool.array.copy()
    rows = np.random.default_rng(2).integers(0, 256, (7, 288), dtype=np.uint8)
    slots = np.array([5, 6, 7, 200, 1, 2, 299])
    scatter_rows(rows, pool.tensor, slots, mode)
    expected = before.copy()
    expected[slots] = rows
    assert np.array_equal(pool.array, expected)


@pytest.mark.parametrize("mode", MODES)
def test_bad_slots_are_refused_before_anything_is_written(mode: str) -> None:
    pool = _pool(3)
    before = pool.array.copy()
    out = torch.zeros(10 * 288, dtype=torch.uint8)
    error = ValueError if mode == "numpy" else KernelInputError
    with pytest.raises(error, match="slot out of range"):
        gather_rows(pool.tensor, np.array([1, 300]), out, 0, mode)
    with pytest.raises(error, match="slot out of range"):
        scatter_rows(np.zeros((2, 288), dtype=np.uint8), pool.tensor, np.array([4, 300]), mode)
    with pytest.raises(error, match="do(es)? not fit"):
        gather_rows(pool.tensor, np.arange(11), out, 0, mode)
    assert np.array_equal(pool.array, before) and int(out.sum()) == 0


def test_the_mode_comes_from_the_caller_or_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(COPY_ENV, raising=False)
    assert copy_mode() == "auto" and copy_mode("torch") == "torch"
    monkeypatch.setenv(COPY_ENV, "triton")
    assert copy_mode() == "triton" and copy_mode("numpy") == "numpy"
    monkeypatch.setenv(COPY_ENV, "cuda")
    with pytest.raises(ValueError, match=r"staging copy mode 'cuda' \(from SGLANG_ASYM_STAGING_COPY\) is not one of"):
        copy_mode()
    with pytest.raises(ValueError, match="staging copy mode 'fast' .from the caller"):
        StagingExtent.reserve(ExtentBuffer("staging", 4096), PayloadManifest((RowGroup("g", 8, 1),)), copy="fast")
