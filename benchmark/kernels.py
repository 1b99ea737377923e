"""Timings of sgl_kernel_ext's gather and scatter on the Flash manifest (N = 2K, 32K, 128K by default),
in SGLang's v41 and v4 pool layouts, against the device's memory-bandwidth floor, plus what a per-group
CRC32C costs on the host (the transfer layer's checksum) for the same bytes.

    python benchmark/kernels.py                                   # CPU: the torch reference
    python benchmark/kernels.py --device cuda --backends triton,torch --out benchmark/results/kernels_gpu.json

Per (layout, N): payload bytes, segments, plan build time (host), gather and scatter time per backend
(median of --reps, after one warm-up run that also builds the launch tables), achieved GB/s (payload
bytes per second; each byte is read once and written once), the floor: one contiguous copy of the same
bytes on the device (`torch.Tensor.copy_`, the best a copy can do) and, on CUDA, the nominal HBM bandwidth
of the device when it is known; and the host CRC32C of the payload group by group (on CUDA after the
device-to-host copy it would need), on one thread.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

try:
    from crc32c import crc32c
except ImportError:  # a lent GPU machine's own python may lack it: the checksum timing is then left out
    crc32c = None

from sgl_kernel_ext import (compressed_kv_layout, gather_plan, index_sites, kv_sites, payload_bytes, ring_sites,
                            run_plan, scatter_plan, swa_sites)
from sgl_kernel_ext.layouts import SGLANG_INDEX_PAGE_SIZE, SGLANG_PAGE_SIZE, index_page_layout, kv_page_layout
from sglang_asym.cache import GroupKind, parse_group
from sglang_asym.config import V41Config
from sglang_asym.split import SplitPlan

NOMINAL_HBM_GBPS = {"H200": 4800.0, "H100": 3350.0, "B200": 8000.0, "GB200": 8000.0, "B300": 8000.0}
RING_ROWS = 2


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device: torch.device, reps: int) -> float:
    fn()  # warm-up: compiles the kernel, builds the launch tables
    _sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _random_bytes(shape, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).to(device)


def request_sites(cfg: V41Config, n_tokens: int, main: str, device: torch.device, seed: int):
    """Sites of the Flash manifest's groups for one request of n_tokens, in buffers holding just
    that request (plus one page) at shuffled page ids."""
    split = SplitPlan(cfg, n_tokens)
    gen = torch.Generator().manual_seed(seed)
    b = split.boundary
    pages = -(-b // SGLANG_PAGE_SIZE) + 1
    full = torch.randperm(pages, generator=gen)[:pages - 1]
    swa_pages = torch.randperm(pages, generator=gen)[:pages - 1]
    sites = []
    for g in split.manifest("release").nonempty().groups:
        gid = parse_group(g.name)
        layer = gid.layer
        if gid.kind is GroupKind.TAIL:
            ring = _random_bytes((RING_ROWS, g.row_bytes), gen, device)
            sites.append(ring_sites(g.name, ring, [(b - 1) % RING_ROWS]))
        elif gid.kind is GroupKind.SWA:
            layout = kv_page_layout(main)
            buf = _random_bytes((pages, layout.page_bytes), gen, device)
            sites.append(swa_sites(g.name, buf, main, range(*split.encoder_swa_rows), swa_pages))
        else:
            ratio = cfg.compress_ratios[layer]
            per_page = SGLANG_PAGE_SIZE // ratio
            if gid.kind is GroupKind.KV:
                name = compressed_kv_layout(main, ratio)
                buf = _random_bytes((pages, kv_page_layout(name, per_page).page_bytes), gen, device)
                sites.append(kv_sites(g.name, buf, name, ratio, range(g.num_rows), full))
            else:
                layout = index_page_layout(cfg.index_head_dim, True)
                buf = _random_bytes((pages * per_page // SGLANG_INDEX_PAGE_SIZE, layout.page_bytes), gen, device)
                sites.append(index_sites(g.name, buf, cfg.index_head_dim, True, ratio, range(g.num_rows), full))
    return split, sites


def measure(cfg: V41Config, n_tokens: int, main: str, device: torch.device, backends: list[str], reps: int) -> dict:
    split, sites = request_sites(cfg, n_tokens, main, device, seed=n_tokens)
    _, landing_sites = request_sites(cfg, n_tokens, main, device, seed=n_tokens + 1)
    total = payload_bytes(sites)
    extent = torch.zeros(total, dtype=torch.uint8, device=device)
    start = time.perf_counter()
    plan = gather_plan(sites, extent)
    plan_s = time.perf_counter() - start
    back = scatter_plan(extent, landing_sites)
    row = {"layout": main, "n_tokens": n_tokens, "boundary": split.boundary, "groups": len(sites),
           "payload_bytes": total, "segments": plan.num_segments, "plan_build_s": plan_s}
    for backend in backends:
        g = _timed(lambda: run_plan(plan, backend), device, reps)
        s = _timed(lambda: run_plan(back, backend), device, reps)
        row[backend] = {"gather_s": g, "scatter_s": s, "gather_gbps": total / g / 1e9, "scatter_gbps": total / s / 1e9}
        if backend == "triton" and "triton" in plan.cache:
            row[backend]["launch_classes"] = [[w, width, int(n.shape[0])] for w, width, _, _, n in plan.cache["triton"][0]]
    # floor: one contiguous device copy of the same bytes
    src = torch.empty_like(extent).copy_(extent)
    floor_s = _timed(lambda: extent.copy_(src), device, reps)
    row["floor"] = {"contiguous_copy_s": floor_s, "contiguous_copy_gbps": total / floor_s / 1e9}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    nominal = next((v for k, v in NOMINAL_HBM_GBPS.items() if k in name), None)
    if nominal is not None:   # read + write of every byte at the nominal bandwidth
        row["floor"]["nominal_hbm_gbps"] = nominal
        row["floor"]["nominal_floor_s"] = 2 * total / (nominal * 1e9)
    for backend in backends:
        row[backend]["gather_vs_contiguous_copy"] = floor_s / row[backend]["gather_s"]
        if nominal is not None:
            row[backend]["gather_vs_nominal_floor"] = row["floor"]["nominal_floor_s"] / row[backend]["gather_s"]
    # the host checksum of the same bytes, group by group (what the transfer layer computes)
    offsets, at = [], 0
    for s in sites:
        offsets.append((at, s.nbytes))
        at += s.nbytes
    host = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    d2h_s = _timed(lambda: host.copy_(extent), device, reps) if device.type == "cuda" else 0.0
    host.copy_(extent)
    if crc32c is None:
        row["host_crc32c"] = None
        return row
    view = memoryview(host.numpy())
    crc_s = _timed(lambda: [crc32c(view[o:o + n]) for o, n in offsets], torch.device("cpu"), reps)
    row["host_crc32c"] = {"crc_s": crc_s, "crc_gbps": total / crc_s / 1e9, "device_to_host_s": d2h_s}
    return row


def staging_paths(reps: int) -> list[dict]:
    """The transfer layer's staging copy (transfer/staging.py gather_rows) of one room of the staged
    transfer tests (4097 tokens: 3.5 MB in 9 groups of 68-4096 byte rows, from churned slot tables) on
    each CPU path, plan building included (a room's ranges are planned as they are handed over)."""
    import numpy as np

    from sglang_asym.transfer.staging import gather_rows

    rng = np.random.default_rng(0)
    b = 4097 - 128
    groups = [(f"L{o}.{k}", rb, b // 2) for o in (2, 8, 14) for k, rb in (("kv", 288), ("index", 68))]
    groups += [("L20.kv", 288, b), ("L20.index", 68, b), ("tails", 4096, 3)]
    tables = {name: torch.from_numpy(rng.integers(0, 256, (8192, rb), dtype=np.uint8)) for name, rb, _ in groups}
    slots = {name: np.concatenate([np.arange(s, s + 37) for s in rng.permutation(8192 // 37)[:-(-n // 37)] * 37])[:n]
             for name, _, n in groups}
    total = sum(rb * n for _, rb, n in groups)
    out = torch.zeros(total, dtype=torch.uint8)
    rows = []
    for mode, threads in (("numpy", 1), ("torch", 1), ("torch", 2)):
        torch.set_num_threads(threads)

        def copy():
            at = 0
            for name, rb, n in groups:
                gather_rows(tables[name], slots[name], out, at, mode, name)
                at += rb * n
        seconds = _timed(copy, torch.device("cpu"), reps)
        rows.append({"mode": mode, "torch_threads": threads, "bytes": total, "seconds": seconds,
                     "gbps": total / seconds / 1e9})
        print(f"[kernels] staging copy {mode} ({threads} torch threads): {seconds * 1e3:.2f} ms for "
              f"{total / 1e6:.2f} MB", flush=True)
    torch.set_num_threads(1)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backends", default="torch", help="comma list of torch, triton")
    ap.add_argument("--layouts", default="v41,v4")
    ap.add_argument("--tokens", default="2048,32768,131072")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="benchmark/results/kernels.json")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: the transfer layer's copy runs on one core; OpenMP teams "
                         "on a shared 2-core machine measure the neighbours)")
    ap.add_argument("--staging-only", action="store_true",
                    help="time the transfer layer's staging copy paths on CPU instead (numpy, torch reference)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    backends = args.backends.split(",")
    cfg = V41Config.flash()
    rows = []
    if args.staging_only:
        rows = staging_paths(args.reps)
    for main_layout in ([] if args.staging_only else args.layouts.split(",")):
        for n in (int(t) for t in args.tokens.split(",")):
            row = measure(cfg, n, main_layout, device, backends, args.reps)
            rows.append(row)
            summary = ", ".join(f"{b} gather {row[b]['gather_gbps']:.1f} GB/s scatter {row[b]['scatter_gbps']:.1f} GB/s"
                                for b in backends)
            print(f"[kernels] {main_layout} N={n}: {row['payload_bytes'] / 1e6:.1f} MB, {row['segments']} segments, "
                  f"plan {row['plan_build_s'] * 1e3:.1f} ms; {summary}; contiguous copy "
                  f"{row['floor']['contiguous_copy_gbps']:.1f} GB/s; host crc32c "
                  f"{row['host_crc32c']['crc_gbps'] if row['host_crc32c'] else float('nan'):.1f} GB/s",
                  flush=True)
    env = {"torch": torch.__version__, "device": str(device), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
    out = {"command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
           "env": env, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"[kernels] wrote {args.out}")


if __name__ == "__main__":
    main()
