"""The compiled Triton kernel on CUDA against the torch reference, byte for byte (skips without a GPU;
scripts/gpu_check.sh runs it on a lent one): both SGLang layouts, B around page and pair boundaries,
gather and scatter, several requests in one launch, the "auto" backend and the staging copy path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_cases import Pools, Request

from sgl_kernel_ext import CopyPlan, gather_plan, payload_bytes, resolve_backend, run_plan, scatter_plan
from sgl_kernel_ext.copy import RUNS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _to_cuda(pools: Pools) -> Pools:
    return Pools(pools.main, *[{k: v.cuda() for k, v in d.items()}
                               for d in (pools.kv, pools.index, pools.swa, pools.ring)])


@pytest.mark.parametrize("main", ["v41", "v4"])
@pytest.mark.parametrize("boundary", [1, 2, 255, 256, 257, 513])
def test_compiled_gather_and_scatter_equal_the_reference(main: str, boundary: int) -> None:
    assert resolve_backend("auto", torch.device("cuda")) == "triton"
    pools = _to_cuda(Pools.build(main, seed=boundary))
    request = Request.random(boundary, seed=boundary)
    sites = request.sites(pools)
    total = payload_bytes(sites)
    out = {}
    for backend in ("torch", "auto"):
        extent = torch.full((total + 128,), 0x5A, dtype=torch.uint8, device="cuda")
        run_plan(gather_plan(sites, extent, 64), backend)
        out[backend] = extent.cpu()
    assert torch.equal(out["torch"], out["auto"])
    assert bytes(out["auto"][64:64 + total].tolist()) == request.expected(Pools(main, *[
        {k: v.cpu() for k, v in d.items()} for d in (pools.kv, pools.index, pools.swa, pools.ring)]))
    wire = out["auto"][64:64 + total].cuda()
    landing = Request.random(boundary, seed=boundary + 100)
    after = []
    for backend in ("torch", "triton"):
        dst = _to_cuda(Pools.build(main, seed=2))
        run_plan(scatter_plan(wire, landing.sites(dst)), backend)
        after.append([t.cpu() for t in dst.tensors()])
    assert all(torch.equal(a, b) for a, b in zip(*after))


def test_several_requests_in_one_compiled_launch() -> None:
    pools = _to_cuda(Pools.build("v41", seed=3))
    requests = [Request.random(b, seed=b) for b in (257, 2, 130)]
    sizes = [payload_bytes(r.sites(pools)) for r in requests]
    offsets = [0, sizes[0] + 64, sizes[0] + 64 + sizes[1] + 8]
    out = {}
    for backend in ("torch", "triton"):
        extent = torch.zeros(offsets[-1] + sizes[-1], dtype=torch.uint8, device="cuda")
        run_plan(CopyPlan.concat([gather_plan(r.sites(pools), extent, at) for r, at in zip(requests, offsets)]),
                 backend)
        out[backend] = extent.cpu()
    assert torch.equal(out["torch"], out["triton"])


def test_the_staging_copy_takes_the_kernel_on_cuda() -> None:
    from sglang_asym.transfer.staging import gather_rows, scatter_rows

    table = torch.randint(0, 256, (300, 288), dtype=torch.uint8, device="cuda")
    slots = np.concatenate([np.arange(40, 90), np.array([3, 299, 0])])
    out = torch.zeros(len(slots) * 288 + 64, dtype=torch.uint8, device="cuda")
    before = RUNS["triton"]
    gather_rows(table, slots, out, 64, mode="auto")
    assert RUNS["triton"] == before + 1
    assert torch.equal(out[64:].view(-1, 288).cpu(), table.cpu()[torch.from_numpy(slots)])
    target = torch.zeros_like(table)
    scatter_rows(out[64:].view(-1, 288), target, slots, mode="auto")
    assert torch.equal(target[torch.from_numpy(slots)].cpu(), table[torch.from_numpy(slots)].cpu())
