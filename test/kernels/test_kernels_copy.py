"""The gather and scatter kernels on CPU: Triton's interpreter against the torch reference byte for
byte, and both against the wire bytes computed row by row from SGLang's page formulas. Random page
tables, B around page (128 pair rows, 256 tokens) and pair boundaries, empty groups, both SGLang
layouts (v41: fp4 compressed KV, fp8 window rows; v4: 576 + 8 byte rows in padded pages), several
requests in one launch."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import Pools, Request

from sgl_kernel_ext import CopyPlan, gather_plan, payload_bytes, run_plan, scatter_plan
from sgl_kernel_ext.copy import RUNS
from sgl_kernel_ext.triton_copy import launch_tables

PAD = 64  # bytes before the payload in the extent (an extent need not start at its buffer's start)


def _gather_both(request: Request, pools: Pools) -> tuple[torch.Tensor, torch.Tensor, CopyPlan]:
    sites = request.sites(pools)
    total = payload_bytes(sites)
    ref = torch.full((PAD + total + PAD,), 0xA5, dtype=torch.uint8)
    tri = ref.clone()
    run_plan(gather_plan(sites, ref, PAD), "torch")
    plan = gather_plan(sites, tri, PAD)
    before = RUNS["triton"]
    run_plan(plan, "triton")
    assert RUNS["triton"] == before + 1
    return ref, tri, plan


@pytest.mark.parametrize("main", ["v41", "v4"])
@pytest.mark.parametrize("boundary", [1, 2, 3, 255, 256, 257, 300, 513])
def test_gather_equals_reference_and_wire_bytes(main: str, boundary: int) -> None:
    pools = Pools.build(main, seed=boundary)
    before = pools.snapshot()
    request = Request.random(boundary, seed=7 * boundary + len(main))
    ref, tri, plan = _gather_both(request, pools)
    expected = request.expected(pools)
    assert len(expected) == plan.nbytes
    assert torch.equal(tri, ref)
    assert bytes(ref[PAD:PAD + len(expected)].tolist()) == expected
    assert ref[:PAD].eq(0xA5).all() and ref[PAD + len(expected):].eq(0xA5).all()   # nothing outside written
    assert all(torch.equal(a, b) for a, b in zip(pools.tensors(), before))        # sources untouched


def _write_rows_one_by_one(sites, wire: torch.Tensor) -> None:
    """The scatter done row part by row part from the sites' fields (no plan, no kernel)."""
    at = 0
    for g in sites:
        for r in range(g.num_rows):
            for k, n in enumerate(g.lengths):
                o = int(g.offsets[r, k])
                g.buffer[int(g.pages[r]), o:o + n] = wire[at:at + n]
                at += n
    assert at == wire.numel()


@pytest.mark.parametrize("main", ["v41", "v4"])
@pytest.mark.parametrize("boundary", [3, 257, 513])
def test_scatter_puts_every_row_at_its_site_and_nothing_else(main: str, boundary: int) -> None:
    request = Request.random(boundary, seed=boundary)
    wire = torch.randint(0, 256, (payload_bytes(request.sites(Pools.build(main, seed=1))),), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(boundary))
    landing = Request.random(boundary, seed=boundary + 100)       # D's own pages for the request
    expected = Pools.build(main, seed=2)
    _write_rows_one_by_one(landing.sites(expected), wire)
    for backend in ("torch", "triton"):
        dst = Pools.build(main, seed=2)
        run_plan(scatter_plan(wire, landing.sites(dst)), backend)
        assert all(torch.equal(a, b) for a, b in zip(dst.tensors(), expected.tensors())), backend


def test_several_requests_in_one_launch() -> None:
    pools = Pools.build("v41", seed=3)
    requests = [Request.random(b, seed=b) for b in (257, 2, 130)]
    sizes = [payload_bytes(r.sites(pools)) for r in requests]
    offsets = [0, sizes[0] + 64, sizes[0] + 64 + sizes[1] + 8]  # extents at arbitrary places in one buffer
    out = {b: torch.zeros(offsets[-1] + sizes[-1], dtype=torch.uint8) for b in ("torch", "triton")}
    for backend, extent in out.items():
        plan = CopyPlan.concat([gather_plan(r.sites(pools), extent, at) for r, at in zip(requests, offsets)])
        run_plan(plan, backend)
    assert torch.equal(out["torch"], out["triton"])
    for r, at, n in zip(requests, offsets, sizes):
        assert bytes(out["triton"][at:at + n].tolist()) == r.expected(pools)


def test_an_empty_payload_is_a_no_op() -> None:
    pools = Pools.build("v41", seed=4)
    request = Request.random(0, seed=0)
    extent = torch.full((16,), 7, dtype=torch.uint8)
    plan = gather_plan(request.sites(pools), extent)
    assert plan.num_segments == 0 and [s.num_rows for s in request.sites(pools)] == [0] * 8
    for backend in ("torch", "triton"):
        run_plan(plan, backend)
    assert extent.eq(7).all()


def test_launch_tables_merge_runs_and_pick_the_widest_word() -> None:
    # a plain row table, slots 10..13 then 3: two runs; 96-byte rows -> 8-byte words
    table = torch.arange(32 * 96, dtype=torch.int64).to(torch.uint8).view(32, 96)
    from sgl_kernel_ext import PageLayout, RowSites
    sites = RowSites.paged("rows", table, PageLayout.rows(96), torch.tensor([10, 11, 12, 13, 3]))
    extent = torch.zeros(5 * 96 + 4, dtype=torch.uint8)
    tables, _, _ = launch_tables(gather_plan([sites], extent, 0))
    assert [(w, width, s.tolist(), d.tolist(), n.tolist()) for w, width, s, d, n in tables] == [
        (8, 16, [3 * 12], [4 * 12], [12]), (8, 128, [10 * 12], [0], [48])]
    # at offset 4 of the extent the destination is only 4-byte aligned: 4-byte words, 24 and 96 of them
    tables, _, _ = launch_tables(gather_plan([sites], extent, 4))
    assert [(w, width, s.tolist(), d.tolist(), n.tolist()) for w, width, s, d, n in tables] == [
        (4, 128, [10 * 24, 3 * 24], [1, 1 + 4 * 24], [96, 24])]


def test_long_runs_are_cut_into_pieces_and_odd_alignments_fall_back_to_bytes() -> None:
    from sgl_kernel_ext import PageLayout, RowSites
    gen = torch.Generator().manual_seed(5)
    table = torch.randint(0, 256, (64, 290), dtype=torch.uint8, generator=gen)   # 290-byte rows: 2-byte words
    slots = torch.cat([torch.arange(5, 45), torch.tensor([1, 0])])                # a 11600-byte run, then two
    sites = RowSites.paged("rows", table, PageLayout.rows(290), slots)
    out = {}
    for backend, offset in (("torch", 3), ("triton", 3), ("triton", 0)):
        extent = torch.zeros(42 * 290 + 3, dtype=torch.uint8)
        run_plan(gather_plan([sites], extent, offset), backend)
        out[(backend, offset)] = extent[offset:offset + 42 * 290]
    expected = table[slots].reshape(-1)
    assert all(torch.equal(v, expected) for v in out.values())
    plan = gather_plan([sites], torch.zeros(42 * 290, dtype=torch.uint8), 0)
    [(word, width, src, dst, n)] = launch_tables(plan)[0]     # 290-byte rows: 2-byte words, one class
    assert (word, width) == (2, 1024)
    assert n.tolist() == [1024] * 5 + [680, 145, 145]         # the 40-row run cut at 1024 words
    assert src.tolist() == [725 + 1024 * k for k in range(6)] + [145, 0]
    assert dst.tolist() == [1024 * k for k in range(6)] + [5800, 5945]


@pytest.mark.parametrize("seed", [0, 1])
def test_arbitrary_segments_between_several_buffers(seed: int) -> None:
    """A plan not made by gather_plan: random lengths and offsets (odd ones included) from three source
    buffers into two destination buffers, destinations disjoint; both backends equal a plain loop."""
    gen = torch.Generator().manual_seed(seed)
    srcs = tuple(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen) for n in (5000, 777, 3000))
    n = 200
    length = torch.randint(1, 40, (n,), generator=gen)
    src_buf = torch.randint(0, 3, (n,), generator=gen)
    src_off = torch.stack([torch.randint(0, srcs[b].numel() - int(m) + 1, (1,), generator=gen)[0]
                           for b, m in zip(src_buf.tolist(), length.tolist())])
    dst_buf = torch.randint(0, 2, (n,), generator=gen)
    dst_off = torch.zeros(n, dtype=torch.int64)
    at = [0, 0]
    for i, (b, m) in enumerate(zip(dst_buf.tolist(), length.tolist())):   # disjoint, with random gaps
        at[b] += int(torch.randint(0, 5, (1,), generator=gen))
        dst_off[i] = at[b]
        at[b] += m
    expected = [torch.zeros(at[0] + 3, dtype=torch.uint8), torch.zeros(at[1] + 3, dtype=torch.uint8)]
    for i in range(n):
        d, s, m = int(dst_off[i]), int(src_off[i]), int(length[i])
        expected[int(dst_buf[i])][d:d + m] = srcs[int(src_buf[i])][s:s + m]
    for backend in ("torch", "triton"):
        dsts = (torch.zeros_like(expected[0]), torch.zeros_like(expected[1]))
        run_plan(CopyPlan(srcs, dsts, src_buf, src_off, dst_buf, dst_off, length), backend)
        assert torch.equal(dsts[0], expected[0]) and torch.equal(dsts[1], expected[1]), backend
