"""One request's rows of one cache group: logical rows [start, end) in one growable tensor.

Rows are appended at the end; `drop_before(r)` forgets rows below r (the sliding window keeps a bounded
number this way: the storage is compacted to the kept rows whenever it has to grow)."""

from __future__ import annotations

import torch


class GroupRows:
    def __init__(self, like: torch.Tensor, start: int = 0) -> None:
        self._data = like  # an empty [0, *row_shape] tensor of the group's dtype and device, then the storage
        self._first = start  # the logical row of _data[0]
        self.start = start  # first valid row
        self.end = start

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def capacity(self) -> int:
        """Rows the storage holds room for (kept and dropped ones alike)."""
        return self._data.shape[0]

    def append(self, rows: torch.Tensor) -> None:
        at, n = self.end - self._first, rows.shape[0]
        if at + n > self._data.shape[0]:
            grown = self._data.new_empty((max(16, 2 * (len(self) + n)), *self._data.shape[1:]))
            grown[: len(self)] = self._data[self.start - self._first : at]
            self._data, self._first, at = grown, self.start, len(self)
        self._data[at : at + n] = rows
        self.end += n

    def read(self, start: int | None = None, end: int | None = None) -> torch.Tensor:
        """Rows [start, end) (default: every stored row), a view valid until the rows are truncated."""
        start = self.start if start is None else start
        end = self.end if end is None else end
        if not self.start <= start <= end <= self.end:
            raise IndexError(f"rows [{start}, {end}) outside stored [{self.start}, {self.end})")
        return self._data[start - self._first : end - self._first]

    def drop_before(self, row: int) -> None:
        self.start = min(max(row, self.start), self.end)

    def truncate(self, end: int) -> None:
        """Forget rows >= end (a rejected speculative suffix)."""
        if not self.start <= end <= self.end:
            raise IndexError(f"cannot truncate rows [{self.start}, {self.end}) to end {end}")
        self.end = end
