"""Bad input to the kernels raises a KernelInputError naming the problem before anything is written:
slots and page ids out of range, parts that leave their page, extents that do not fit or that
overlap (several requests, or rows scattered twice to one site), copies that would read what they
write, and buffers on different devices."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import Pools, Request

from sgl_kernel_ext import (CopyPlan, KernelInputError, PageLayout, RowSites, gather, gather_plan, kv_page_layout,
                            kv_sites, payload_bytes, scatter, scatter_plan, slots_from_page_table)


def _table(rows: int = 8, row_bytes: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _rows(table: torch.Tensor, slots: list[int], name: str = "g") -> RowSites:
    return RowSites.paged(name, table, PageLayout.rows(int(table.shape[1])), torch.tensor(slots))


def test_slots_out_of_range() -> None:
    table = _table()
    with pytest.raises(KernelInputError, match=r"g: slot out of range \(min 0, max 8, the buffer holds 8\)"):
        _rows(table, [0, 8])
    with pytest.raises(KernelInputError, match="slot out of range"):
        _rows(table, [-1])
    with pytest.raises(KernelInputError, match="page id out of range"):
        RowSites("g", table, torch.tensor([9]), torch.zeros((1, 1), dtype=torch.int64), (32,))
    with pytest.raises(KernelInputError, match="leaves its 32-byte page"):
        RowSites("g", table, torch.tensor([1]), torch.tensor([[8]]), (32,))


def test_rows_past_the_page_table() -> None:
    with pytest.raises(KernelInputError, match="need 3 pages of 128 rows, the page table has 2"):
        slots_from_page_table(torch.tensor([4, 1]), torch.arange(257), 128)
    with pytest.raises(KernelInputError, match="unassigned"):
        slots_from_page_table(torch.tensor([4, -1]), torch.arange(200), 128)
    pools = Pools.build("v41", seed=0)
    with pytest.raises(KernelInputError, match="slot out of range"):   # page 5 of a 5-page buffer
        kv_sites("kv.L20", pools.kv[20], "v41_fp4", 1, range(10), [5])


def test_page_layouts_that_leave_the_page() -> None:
    with pytest.raises(KernelInputError, match="leaves the 100-byte page"):
        PageLayout.block_split(4, 20, 6, page_bytes=100)
    with pytest.raises(KernelInputError, match="not a whole number of 73728-byte pages"):
        RowSites.paged("kv", torch.zeros(73728 + 1, dtype=torch.uint8), kv_page_layout("v41_fp4", 256), [0])


def test_an_extent_that_does_not_fit() -> None:
    table = _table()
    extent = torch.full((95,), 3, dtype=torch.uint8)
    with pytest.raises(KernelInputError, match="the 96-byte payload does not fit the 95-byte extent at offset 0"):
        gather([_rows(table, [0, 1, 2])], extent)
    with pytest.raises(KernelInputError, match="does not fit the 95-byte extent at offset 64"):
        gather([_rows(table, [0])], extent, 64)
    with pytest.raises(KernelInputError, match="does not fit"):
        scatter(extent, [_rows(table, [0, 1, 2])])
    assert extent.eq(3).all()


def test_requests_whose_extents_overlap_in_one_launch() -> None:
    table, extent = _table(), torch.zeros(256, dtype=torch.uint8)
    first = gather_plan([_rows(table, [0, 1])], extent, 0)     # bytes [0, 64)
    second = gather_plan([_rows(table, [2, 3])], extent, 32)   # bytes [32, 96)
    with pytest.raises(KernelInputError, match="destination segments overlap"):
        CopyPlan.concat([first, second])
    assert extent.eq(0).all()


def test_rows_scattered_twice_to_one_site() -> None:
    table = _table(seed=1)
    before = table.clone()
    with pytest.raises(KernelInputError, match="destination segments overlap"):
        scatter(torch.zeros(96, dtype=torch.uint8), [_rows(table, [1, 5, 1])])
    # two groups naming the same rows of one buffer through different views
    alias = table.view(-1).view(8, 32)
    with pytest.raises(KernelInputError, match="destination segments overlap"):
        scatter(torch.zeros(64, dtype=torch.uint8), [_rows(table, [6]), _rows(alias, [6], "alias")])
    assert torch.equal(table, before)


def test_a_copy_that_reads_what_it_writes() -> None:
    table = _table(seed=2)
    before = table.clone()
    inside = table.view(-1)[64:160]            # an "extent" inside the pool it gathers from
    with pytest.raises(KernelInputError, match="overlaps the plan's source bytes"):
        gather([_rows(table, [0, 3, 4])], inside)
    assert torch.equal(table, before)


def test_buffers_on_different_devices_and_bad_tables() -> None:
    with pytest.raises(KernelInputError, match="share one device"):
        CopyPlan((_table(),), (torch.zeros(8, dtype=torch.uint8, device="meta"),),
                 *[torch.zeros(0, dtype=torch.int64)] * 5)
    with pytest.raises(KernelInputError, match="int64 vectors of one length"):
        CopyPlan((_table(),), (torch.zeros(8, dtype=torch.uint8),), *[torch.zeros(1, dtype=torch.int32)] * 5)
    with pytest.raises(KernelInputError, match="contiguous uint8"):
        gather_plan([], torch.zeros(8, dtype=torch.float32))
    with pytest.raises(KernelInputError, match="at least one byte"):
        z = torch.zeros(1, dtype=torch.int64)
        CopyPlan((_table(),), (torch.zeros(8, dtype=torch.uint8),), z, z, z, z, z)


def test_a_bad_request_among_good_ones_writes_nothing() -> None:
    pools = Pools.build("v41", seed=3)
    good = Request.random(300, seed=1)
    extent = torch.full((payload_bytes(good.sites(pools)) + 100,), 9, dtype=torch.uint8)
    with pytest.raises(KernelInputError):
        CopyPlan.concat([gather_plan(good.sites(pools), extent, 0),
                         gather_plan(good.sites(pools)[:1], extent, 100)])   # second request over the first
    assert extent.eq(9).all()
    wire = torch.zeros(payload_bytes(good.sites(pools)), dtype=torch.uint8)
    plan = scatter_plan(wire, good.sites(pools))
    assert plan.num_segments > 0                # a valid scatter of the same request is accepted
