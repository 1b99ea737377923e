"""One request's rows of one cache group (`cache/rows.py`): appends, the window's drops, rollback, and storage
that stays bounded by the kept rows."""

import pytest
import torch

from sglang_asym.cache import GroupRows


def _rows(first: int, count: int) -> torch.Tensor:
    return torch.arange(first, first + count, dtype=torch.float32).unsqueeze(1).repeat(1, 3)


def test_appends_reads_and_truncation_keep_logical_rows():
    rows = GroupRows(torch.empty((0, 3)), start=5)
    rows.append(_rows(5, 10))
    rows.append(_rows(15, 30))
    assert (rows.start, rows.end, len(rows)) == (5, 45, 40)
    assert torch.equal(rows.read(), _rows(5, 40))
    assert torch.equal(rows.read(20, 23), _rows(20, 3))
    rows.truncate(30)
    rows.append(_rows(100, 2))  # rows past a rollback are written again
    assert torch.equal(rows.read(28, 32), torch.cat((_rows(28, 2), _rows(100, 2))))
    with pytest.raises(IndexError, match=r"rows \[4, 10\) outside stored \[5, 32\)"):
        rows.read(4, 10)
    with pytest.raises(IndexError, match=r"cannot truncate rows \[5, 32\) to end 33"):
        rows.truncate(33)


def test_a_sliding_window_keeps_its_storage_bounded():
    rows, window = GroupRows(torch.empty((0, 3))), 16
    rows.append(_rows(0, 100))  # a prompt in one forward
    rows.drop_before(100 - window)
    for token in range(100, 1100):  # decode: one row a step, the window's drop after each
        rows.append(_rows(token, 1))
        rows.drop_before(token + 1 - window)
    assert (rows.start, rows.end) == (1100 - window, 1100)
    assert torch.equal(rows.read(), _rows(1100 - window, window))
    assert rows.capacity <= 2 * (window + 1)
    with pytest.raises(IndexError, match=r"outside stored \[1084, 1100\)"):
        rows.read(1083, 1100)
