"""Paged row storage: one pool per cache group, pages of fixed rows, an allocator that can prove
it leaks nothing (free + used == capacity, and every page has exactly one owner)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


class OutOfPages(RuntimeError):
    """A pool has no free page left for a request."""


@dataclass(frozen=True)
class PoolSpec:
    name: str
    row_shape: tuple[int, ...]
    dtype: torch.dtype
    page_rows: int
    num_pages: int

    def __post_init__(self) -> None:
        if self.page_rows <= 0 or self.num_pages <= 0:
            raise ValueError(f"pool {self.name}: page_rows and num_pages must be positive")


class PagedPool:
    """A tensor [num_pages, page_rows, *row_shape] plus a free list of page ids."""

    def __init__(self, spec: PoolSpec, device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.storage = torch.zeros((spec.num_pages, spec.page_rows, *spec.row_shape), dtype=spec.dtype, device=device)
        self._free = list(range(spec.num_pages - 1, -1, -1))
        self._owner: dict[int, object] = {}

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return len(self._owner)

    def alloc(self, owner: object) -> int:
        if not self._free:
            raise OutOfPages(f"pool {self.spec.name!r} is full ({self.spec.num_pages} pages of {self.spec.page_rows} rows)")
        page = self._free.pop()
        self._owner[page] = owner
        return page

    def free(self, page: int, owner: object) -> None:
        if self._owner.get(page) is not owner:
            raise RuntimeError(f"pool {self.spec.name!r}: page {page} freed by a request that does not own it")
        del self._owner[page]
        self._free.append(page)

    def check_no_leak(self) -> None:
        if self.free_pages + self.used_pages != self.spec.num_pages or len(set(self._free)) != len(self._free):
            raise AssertionError(f"pool {self.spec.name!r}: allocator accounting broken")


class PagedRows:
    """One request's rows in one pool: logical rows [start, end) mapped onto pages.

    Rows are appended at the end; `drop_before(r)` releases whole pages that hold only rows < r
    (the sliding window keeps a bounded number of pages this way)."""

    def __init__(self, pool: PagedPool, owner: object, start: int = 0) -> None:
        self.pool, self.owner = pool, owner
        self.base = start - start % pool.spec.page_rows  # logical row of the first page's row 0
        self.start = start  # first valid row
        self.end = start
        self.pages: list[int] = []

    def __len__(self) -> int:
        return self.end - self.start

    def append(self, rows: torch.Tensor) -> None:
        page_rows = self.pool.spec.page_rows
        n = rows.shape[0]
        written = 0
        while written < n:
            offset = self.end - self.base
            page_idx, in_page = divmod(offset, page_rows)
            if page_idx == len(self.pages):
                self.pages.append(self.pool.alloc(self.owner))
            take = min(n - written, page_rows - in_page)
            self.pool.storage[self.pages[page_idx], in_page : in_page + take] = rows[written : written + take]
            written += take
            self.end += take

    def read(self, start: int | None = None, end: int | None = None) -> torch.Tensor:
        start = self.start if start is None else start
        end = self.end if end is None else end
        if not self.start <= start <= end <= self.end:
            raise IndexError(f"rows [{start}, {end}) outside stored [{self.start}, {self.end}) in {self.pool.spec.name!r}")
        page_rows = self.pool.spec.page_rows
        first, last = (start - self.base) // page_rows, (end - self.base + page_rows - 1) // page_rows
        if end == start:
            return self.pool.storage.new_empty((0, *self.pool.spec.row_shape))
        block = self.pool.storage[self.pages[first:last]].flatten(0, 1)
        lo = start - self.base - first * page_rows
        return block[lo : lo + end - start]

    def drop_before(self, row: int) -> None:
        row = min(max(row, self.start), self.end)
        page_rows = self.pool.spec.page_rows
        whole = (row - self.base) // page_rows
        for page in self.pages[:whole]:
            self.pool.free(page, self.owner)
        self.pages = self.pages[whole:]
        self.base += whole * page_rows
        self.start = row

    def truncate(self, end: int) -> None:
        """Forget rows >= end (a rejected speculative suffix) and free pages left empty."""
        if not self.start <= end <= self.end:
            raise IndexError(f"cannot truncate {self.pool.spec.name!r} rows [{self.start}, {self.end}) to end {end}")
        page_rows = self.pool.spec.page_rows
        keep = -(-(end - self.base) // page_rows)
        for page in self.pages[keep:]:
            self.pool.free(page, self.owner)
        self.pages = self.pages[:keep]
        self.end = end

    def release(self) -> None:
        for page in self.pages:
            self.pool.free(page, self.owner)
        self.pages = []
        self.start = self.end = self.base = 0
