"""The CPU route's fp4 index-key store (cpu_ops.store_fp4_index_k_in_torch, the CPU patch of SGLang's
`store_fp4_index_k_cache` on P's layer-L KV path) writes the bytes SGLang's own Triton kernels write, under
Triton's CPU interpreter (index_k_store_checks.py runs both in a fresh process): for rows whose group maxima
run from below the quantizer's 1e-4 scale floor to 1e3, values at every e2m1 boundary (both signs, at scales
1 and 2 ** -3), signed zeros and bf16 input, with both roundings."""

import json

import pytest
import torch

from sglang_asym.sglang_plugin.cpu_platform.cpu_ops import store_fp4_index_k_in_torch

from .conftest import REPO, run_python

CASES = ("scaled", "edges", "eighths", "zeros", "tiny", "bf16")


@pytest.fixture(scope="module")
def report():
    done = run_python([str(REPO / "test/sglang_plugin/index_k_store_checks.py")], extra_env={"TRITON_INTERPRET": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


@pytest.mark.parametrize("rounding", ["thresholds", "rne"])
@pytest.mark.parametrize("case", CASES)
def test_the_bytes_equal_sglangs_kernels(report, case, rounding):
    facts = report[f"{case}/{rounding}"]
    assert facts["differing_bytes"] == 0
    assert facts["written_bytes"] >= 40 * 4  # every row's four scale bytes at least (a scale exponent is >= 1)


def test_the_cases_tell_the_two_roundings_apart(report):
    moved = report["rne_vs_thresholds_bytes"]
    assert moved["edges"] > 0 and moved["eighths"] > 0


def test_one_row_by_hand():
    """A group of 32: maximum 3.0 -> scale 2 ** ceil(log2(3.0 / 6)) = 0.5; 0.3 / 0.5 = 0.6 -> code 1 (0.5);
    -1.0 / 0.5 = -2 -> code 4 with the sign bit (0xC); 3.0 / 0.5 = 6 -> code 7."""
    row = torch.zeros(1, 128)
    row[0, :3] = torch.tensor([0.3, -1.0, 3.0])
    cache = torch.zeros(2, 4 * 68, dtype=torch.uint8)
    store_fp4_index_k_in_torch(row, cache, torch.tensor([5]), page_size=4)  # page 1, slot 1
    assert cache[0].eq(0).all()
    page = cache[1]
    assert page[64:66].tolist() == [0x1 | 0xC << 4, 0x7]  # codes (value 0 low nibble, value 1 high nibble)
    # 2 ** (126 - 127) = 0.5; an empty group's scale is the floor 1e-4 rounded up to 2 ** -13 (114 - 127)
    assert page[4 * 64 + 4:4 * 64 + 8].tolist() == [126, 114, 114, 114]
    assert int(page.ne(0).sum()) == 2 + 4


def test_a_row_of_another_width_is_refused():
    with pytest.raises(ValueError, match="128 values per row"):
        store_fp4_index_k_in_torch(torch.zeros(1, 64), torch.zeros(1, 68, dtype=torch.uint8), torch.tensor([0]),
                                   page_size=1)
