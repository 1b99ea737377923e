"""The payload arithmetic of benchmark/transfer.py, checked against hand-computed numbers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("transfer_benchmark",
                                               Path(__file__).parents[2] / "benchmark" / "transfer.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("n, expected", [(1, 0), (128, 0), (129, 356 + 3 * 4096), (130, 890 * 2),
                                         (512, 890 * 384), (32768, 890 * 32640)])
def test_minimum_asym_bytes(n: int, expected: int) -> None:
    assert bench.minimum_asym_payload_bytes(n) == expected
    assert bench.asym_manifest(n).total_bytes == expected


def test_symmetric_bytes() -> None:
    assert bench.symmetric_payload_bytes(512) == {
        "compressed_rows": 890 * 512, "swa_rows": 40 * 128 * 528, "pair_rings": 0,
        "draft_swa_ring": 256 * 528, "total": 890 * 512 + 40 * 128 * 528 + 256 * 528}
    odd = bench.symmetric_payload_bytes(101)
    assert odd["compressed_rows"] == 3 * 356 * 50 + 356 * 101
    assert (odd["swa_rows"], odd["pair_rings"]) == (40 * 101 * 528, 3 * 8 * 4096)
