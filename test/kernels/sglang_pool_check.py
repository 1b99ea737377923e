"""Run in a fresh process by test_kernels_sglang_pool.py (SGLang's CPU context changes the process):
the kernels on SGLang 0.5.23's own DeepSeekV4TokenToKVPool built on CPU, in the v41 and v4 layouts.
Prints one line `REPORT <json>` with raw facts; the test asserts on them.

    python test/kernels/sglang_pool_check.py
"""

from __future__ import annotations

import json

import numpy as np
import torch

PROMPT, WINDOW = 429, 128    # B = 301: odd (tails), two pages, window rows [174, 301) across a page boundary


def _fill(pool, seed: int) -> None:
    """Random bytes in every buffer the payload can touch (so a wrong address reads something else)."""
    gen = torch.Generator().manual_seed(seed)
    bufs = [b for kv in pool.kv_pools.values() for b in kv.kv_buffer]
    bufs += [b for ip in pool.index_pools.values() for b in ip.index_k_with_scale_buffer]
    bufs += list(pool.swa_kv_pool.kv_buffer)
    bufs += [r.kv_score_buffer.kv_score for r in pool.compress_state_pools if r is not None and r.request_scoped]
    for b in bufs:
        flat = b.view(torch.uint8).reshape(-1)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=gen))


def _sites(pool, split, pages):
    from sgl_kernel_ext import pool_group_sites

    out = []
    for g in split.manifest("release").nonempty().groups:
        rows = range(*split.encoder_swa_rows) if g.name.startswith("swa.") else range(g.num_rows)
        out.append(pool_group_sites(pool, g.name, rows, pages.full_pages, pages.swa_pages, pages.req_pool_idx,
                                    split.boundary))
    return out


def main() -> dict:
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

    from sgl_kernel_ext import gather_plan, payload_bytes, run_plan, scatter_plan
    from sgl_kernel_ext.layouts import KV_FORMATS, compressed_kv_layout, kv_page_layout
    from sglang_asym.sglang_plugin import pool_payload as pp
    from sglang_asym.sglang_plugin.kv_pool import build_kv_pool
    from sglang_asym.sglang_plugin.sglang_cpu import sglang_cpu_context
    from sglang_asym.sglang_plugin.sglang_shapes import sglang_small
    from sglang_asym.split import SplitPlan

    report: dict = {"layouts": {}}
    for name in KV_FORMATS:
        theirs = KVLayout.parse(name)
        for page_size in (256, 128, 64):
            ours = kv_page_layout(name, page_size)
            data_stride, scale_base, scale_stride = theirs.row_addressing(page_size)
            expected_parts = ((0, data_stride, theirs.data_bytes),) if theirs.scale_bytes == 0 else (
                ((0, data_stride, theirs.bytes_per_token),) if theirs.is_interleaved else
                ((0, data_stride, theirs.data_bytes), (scale_base, scale_stride, theirs.scale_bytes)))
            report["layouts"][f"{name}/{page_size}"] = (ours.page_bytes == theirs.page_bytes(page_size)
                                                        and ours.parts == expected_parts)
    cfg = sglang_small()
    split = SplitPlan(cfg, PROMPT, WINDOW, "asym-exact-encoder")
    manifest = split.manifest("release").nonempty()
    src_pages = pp.RequestPages(full_pages=(3, 1), swa_pages=(1, 0), req_pool_idx=2)
    dst_pages = pp.RequestPages(full_pages=(5, 6), swa_pages=(2, 4), req_pool_idx=1)
    with sglang_cpu_context():
        for main_layout in ("v41", "v4"):
            facts = report[main_layout] = {}
            src, dst = (build_kv_pool(cfg, full_tokens=2048, swa_tokens=1024, max_reqs=4, kv_layout=main_layout)
                        for _ in range(2))
            facts["compressed_layouts"] = {
                r: [src.compressed_kv_layout(r).value, compressed_kv_layout(main_layout, r)]
                for r in sorted(src.kv_pools)}
            facts["index_fp4"] = {r: bool(ip.use_fp4_indexer) for r, ip in src.index_pools.items()}
            _fill(src, 1)
            _fill(dst, 2)
            if main_layout == "v41":   # our release rows fit the v41 pool: written by the plugin's own code
                gen = np.random.default_rng(3)
                rows = {g.name: gen.integers(0, 256, (g.num_rows, g.row_bytes), dtype=np.uint8)
                        for g in manifest.groups}
                pp.write_payload(src, src_pages, split, rows)
            sites = _sites(src, split, src_pages)
            facts["groups"] = [[s.name, s.num_rows, s.row_bytes] for s in sites]
            wire = {}
            for backend in ("torch", "triton"):
                extent = torch.zeros(payload_bytes(sites), dtype=torch.uint8)
                run_plan(gather_plan(sites, extent), backend)
                wire[backend] = extent
            facts["gather_backends_equal"] = bool(torch.equal(wire["torch"], wire["triton"]))
            if main_layout == "v41":
                expected = np.concatenate([rows[g.name].reshape(-1) for g in manifest.groups])
                facts["gather_equals_plugin_rows"] = bool(np.array_equal(wire["torch"].numpy(), expected))
            # scatter into D's pool at other pages, by each backend from the same state, then compare
            dst_sites = _sites(dst, split, dst_pages)
            before = {n: t.clone() for n, t in _buffers(dst).items()}
            after = {}
            for backend in ("torch", "triton"):
                for n, t in _buffers(dst).items():
                    t.copy_(before[n])
                run_plan(scatter_plan(wire["torch"], dst_sites), backend)
                after[backend] = {n: t.clone() for n, t in _buffers(dst).items()}
                back = torch.zeros_like(wire["torch"])
                run_plan(gather_plan(dst_sites, back), "torch")
                facts[f"scatter_{backend}_roundtrip"] = bool(torch.equal(back, wire["torch"]))
            facts["scatter_backends_equal"] = all(torch.equal(after["torch"][n], after["triton"][n]) for n in before)
            changed = {n for n in before if not torch.equal(after["torch"][n], before[n])}
            facts["buffers_changed"] = sorted(changed)
            if main_layout == "v41":   # the plugin's own reader at D's pages sees the rows
                back = pp.read_payload(dst, dst_pages, split)
                facts["plugin_reads_scattered_rows"] = all(np.array_equal(back[g], rows[g]) for g in rows)
    return report


def _buffers(pool) -> dict[str, torch.Tensor]:
    out = {}
    for r, kv in pool.kv_pools.items():
        out.update({f"kv.c{r}.{k}": b.view(torch.uint8) for k, b in enumerate(kv.kv_buffer)})
    for r, ip in pool.index_pools.items():
        out.update({f"index.c{r}.{k}": b for k, b in enumerate(ip.index_k_with_scale_buffer)})
    out.update({f"swa.{i}": b.view(torch.uint8) for i, b in enumerate(pool.swa_kv_pool.kv_buffer)})
    out.update({f"ring.{i}": r.kv_score_buffer.kv_score.view(torch.uint8)
                for i, r in enumerate(pool.compress_state_pools) if r is not None and r.request_scoped})
    return out


if __name__ == "__main__":
    print("REPORT " + json.dumps(main()))
