"""Row sites: where each row of a payload group sits in a paged buffer, as byte parts of a page.

A payload row (the wire's unit: one token's, pair's or tail's bytes) may be split across its page:
SGLang's block-split KV pages keep every slot's data first and every slot's scales after them, so
one row is two parts. `PageLayout` says where slot i's parts sit inside one page, `RowSites` lists
the page and part offsets of a group's rows in wire order, with part lengths shared by all rows.
A plain table of rows (one row per page) is the one-part case.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class KernelInputError(ValueError):
    """Input a copy cannot honour (names the group, buffer or row); raised before anything is written."""


@dataclass(frozen=True)
class PageLayout:
    """Slot i of a page (0 <= i < rows_per_page) has part k at base_k + i * stride_k, length_k bytes."""

    rows_per_page: int
    page_bytes: int
    parts: tuple[tuple[int, int, int], ...]  # (base, stride, length) per part, in the row's byte order

    def __post_init__(self) -> None:
        if self.rows_per_page < 1 or self.page_bytes < 1 or not self.parts:
            raise KernelInputError(f"bad page layout {self}: needs rows_per_page >= 1, page_bytes >= 1, parts")
        last = self.rows_per_page - 1
        for base, stride, length in self.parts:
            if base < 0 or stride < 0 or length < 1 or base + last * stride + length > self.page_bytes:
                raise KernelInputError(f"page layout part (base {base}, stride {stride}, length {length}) "
                                       f"leaves the {self.page_bytes}-byte page for slot {last}")

    @property
    def row_bytes(self) -> int:
        return sum(length for _, _, length in self.parts)

    @classmethod
    def rows(cls, row_bytes: int) -> "PageLayout":
        """A plain row table: one row per 'page' (a pool slot, a ring row)."""
        return cls(1, row_bytes, ((0, 0, row_bytes),))

    @classmethod
    def block_split(cls, rows_per_page: int, data_bytes: int, scale_bytes: int, page_bytes: int | None = None
                    ) -> "PageLayout":
        """All slots' data, then all slots' scales (SGLang's block-split pages; page_bytes may pad)."""
        raw = rows_per_page * (data_bytes + scale_bytes)
        parts = ((0, data_bytes, data_bytes),) + \
            (((rows_per_page * data_bytes, scale_bytes, scale_bytes),) if scale_bytes else ())
        return cls(rows_per_page, raw if page_bytes is None else page_bytes, parts)

    @classmethod
    def interleaved(cls, rows_per_page: int, data_bytes: int, scale_bytes: int, page_bytes: int | None = None
                    ) -> "PageLayout":
        """Each slot's data immediately followed by its scales: the row is one part."""
        row = data_bytes + scale_bytes
        return cls(rows_per_page, rows_per_page * row if page_bytes is None else page_bytes, ((0, row, row),))


def as_page_table(buffer: torch.Tensor, page_bytes: int, what: str) -> torch.Tensor:
    """The buffer as [pages, page_bytes] uint8 (it must be contiguous: pages are addressed flat)."""
    if buffer.dtype != torch.uint8:
        buffer = buffer.view(torch.uint8) if buffer.is_contiguous() else buffer
    if buffer.dtype != torch.uint8 or not buffer.is_contiguous():
        raise KernelInputError(f"{what}: the buffer must be a contiguous tensor (got {buffer.dtype}, "
                               f"contiguous={buffer.is_contiguous()})")
    flat = buffer.reshape(-1)
    if flat.numel() % page_bytes:
        raise KernelInputError(f"{what}: a {flat.numel()}-byte buffer is not a whole number of "
                               f"{page_bytes}-byte pages")
    return flat.view(-1, page_bytes)


@dataclass(frozen=True, eq=False)
class RowSites:
    """Rows of one group in wire order: row r's part k is `lengths[k]` bytes at byte
    `pages[r] * page_bytes + offsets[r, k]` of `buffer` ([pages, page_bytes] uint8)."""

    name: str
    buffer: torch.Tensor          # [num_pages, page_bytes] uint8, contiguous
    pages: torch.Tensor           # int64 [rows]
    offsets: torch.Tensor         # int64 [rows, parts], byte offset inside the page
    lengths: tuple[int, ...]      # bytes of each part (same for every row)

    def __post_init__(self) -> None:
        b, p, o = self.buffer, self.pages, self.offsets
        if b.dtype != torch.uint8 or b.dim() != 2 or not b.is_contiguous():
            raise KernelInputError(f"{self.name}: buffer must be contiguous 2-D uint8, got {b.dtype} {tuple(b.shape)}")
        if p.dim() != 1 or o.dim() != 2 or o.shape != (p.shape[0], len(self.lengths)) or not self.lengths:
            raise KernelInputError(f"{self.name}: pages [rows] and offsets [rows, {len(self.lengths)}] needed, got "
                                   f"{tuple(p.shape)} and {tuple(o.shape)}")
        if any(n < 1 for n in self.lengths):
            raise KernelInputError(f"{self.name}: part lengths must be positive, got {self.lengths}")
        if p.dtype != torch.int64 or o.dtype != torch.int64:
            raise KernelInputError(f"{self.name}: pages and offsets must be int64")
        if p.device != b.device or o.device != b.device:
            raise KernelInputError(f"{self.name}: pages, offsets and buffer must share a device")
        if p.numel():
            num_pages, page_bytes = b.shape
            lo, hi = int(p.min()), int(p.max())
            if lo < 0 or hi >= num_pages:
                raise KernelInputError(f"{self.name}: page id out of range (min {lo}, max {hi}, the buffer has "
                                       f"{num_pages} pages)")
            ends = o + torch.tensor(self.lengths, dtype=torch.int64, device=o.device)
            if int(o.min()) < 0 or int(ends.max()) > page_bytes:
                raise KernelInputError(f"{self.name}: a row part leaves its {page_bytes}-byte page "
                                       f"(offsets {int(o.min())}..{int(ends.max())})")

    @property
    def num_rows(self) -> int:
        return int(self.pages.shape[0])

    @property
    def row_bytes(self) -> int:
        return sum(self.lengths)

    @property
    def nbytes(self) -> int:
        return self.num_rows * self.row_bytes

    @classmethod
    def paged(cls, name: str, buffer: torch.Tensor, layout: PageLayout, slots: torch.Tensor) -> "RowSites":
        """Rows at global slots (page * rows_per_page + slot in page) of a buffer in `layout`."""
        table = as_page_table(buffer, layout.page_bytes, name)
        slots = torch.as_tensor(slots, dtype=torch.int64, device=table.device).reshape(-1)
        capacity = table.shape[0] * layout.rows_per_page
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= capacity):
            raise KernelInputError(f"{name}: slot out of range (min {int(slots.min())}, max {int(slots.max())}, "
                                   f"the buffer holds {capacity})")
        pages, in_page = slots // layout.rows_per_page, slots % layout.rows_per_page
        base = torch.tensor([b for b, _, _ in layout.parts], dtype=torch.int64, device=table.device)
        stride = torch.tensor([s for _, s, _ in layout.parts], dtype=torch.int64, device=table.device)
        offsets = base[None, :] + in_page[:, None] * stride[None, :]
        return cls(name, table, pages, offsets, tuple(n for _, _, n in layout.parts))


def slots_from_page_table(page_table: torch.Tensor, rows: torch.Tensor, rows_per_page: int) -> torch.Tensor:
    """Global slots of request-relative rows, given the request's page ids (row r lives in page
    `page_table[r // rows_per_page]`, slot r % rows_per_page); a row past the table raises."""
    page_table = torch.as_tensor(page_table, dtype=torch.int64)
    rows = torch.as_tensor(rows, dtype=torch.int64, device=page_table.device).reshape(-1)
    if rows.numel() == 0:
        return rows
    k = rows // rows_per_page
    if int(rows.min()) < 0 or int(k.max()) >= page_table.numel():
        raise KernelInputError(f"rows {int(rows.min())}..{int(rows.max())} need {int(k.max()) + 1} pages of "
                               f"{rows_per_page} rows, the page table has {page_table.numel()}")
    pages = page_table[k]
    if int(pages.min()) < 0:
        raise KernelInputError("a row falls on a page the page table leaves unassigned (negative id)")
    return pages * rows_per_page + rows % rows_per_page
