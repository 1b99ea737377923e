"""The Triton executor of a copy plan: one kernel copying tiles of segments, launched once per
(word size, width class) of the plan's segments.

Launch tables are derived from the plan once (kept in plan.cache):
  1. segments that continue each other on both sides (a run of adjacent pool slots) are merged;
  2. each segment gets the widest word (8, 4, 2 or 1 bytes) dividing its offsets, its length and
     both sides' base addresses, so rows move as 8-byte words wherever the layout allows;
  3. long segments are cut into pieces of at most MAX_WIDTH words;
  4. segments are classed by width (16, 128, MAX_WIDTH words): a program copies a tile of
     TILE // width segments x width words, masked to each segment's length.
Offsets are relative to the lowest buffer address of each side, so one launch reads from every
source buffer of the plan (all buffers of a plan live on one device: one address space).

On CPU tensors the kernel runs in Triton's interpreter (the test path: `TRITON_INTERPRET=1`
behaviour without the environment variable); on CUDA tensors it is compiled.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from .plan import CopyPlan

TILE = 4096                   # words one program copies at most
WIDTHS = (16, 128, 1024)      # width classes, in words
MAX_WIDTH = WIDTHS[-1]
_WORD_DTYPES = {1: tl.uint8, 2: tl.int16, 4: tl.int32, 8: tl.int64}


def _copy_segments(src, dst, src_off, dst_off, lengths, num_segments,
                   SEGS: tl.constexpr, WIDTH: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    seg = pid * SEGS + tl.arange(0, SEGS)
    live = seg < num_segments
    s = tl.load(src_off + seg, mask=live, other=0)
    d = tl.load(dst_off + seg, mask=live, other=0)
    n = tl.load(lengths + seg, mask=live, other=0)
    col = tl.arange(0, WIDTH)
    mask = col[None, :] < n[:, None]
    words = tl.load(src + s[:, None] + col[None, :], mask=mask)
    tl.store(dst + d[:, None] + col[None, :], words, mask=mask)


_KERNELS: dict[str, object] = {}


def _kernel(interpret: bool):
    key = "interpret" if interpret else "jit"
    if key not in _KERNELS:
        _KERNELS[key] = InterpretedFunction(_copy_segments) if interpret else triton.jit(_copy_segments)
    return _KERNELS[key]


def _side(buffers: tuple[torch.Tensor, ...], which: torch.Tensor, off: torch.Tensor
          ) -> tuple[int, torch.Tensor, int]:
    """(index of the lowest-address buffer, offsets relative to it, its address)."""
    ptrs = [b.data_ptr() for b in buffers]
    low = min(range(len(buffers)), key=ptrs.__getitem__)
    rel = torch.tensor([p - ptrs[low] for p in ptrs], dtype=torch.int64, device=off.device)
    return low, rel[which] + off, ptrs[low]


LaunchTable = tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor]


def launch_tables(plan: CopyPlan) -> tuple[list[LaunchTable], int, int]:
    """([(word bytes, width, src offsets in words, dst offsets in words, lengths in words)] per
    class, the source and destination buffers the offsets are relative to)."""
    dev = plan.device
    src_low, src, src_base = _side(plan.src_buffers, plan.src_buf, plan.src_off)
    dst_low, dst, dst_base = _side(plan.dst_buffers, plan.dst_buf, plan.dst_off)
    length = plan.length
    # 1. merge continuing segments
    starts = torch.ones_like(length, dtype=torch.bool)
    starts[1:] = (src[1:] != src[:-1] + length[:-1]) | (dst[1:] != dst[:-1] + length[:-1])
    run = torch.cumsum(starts.to(torch.int64), 0) - 1
    src, dst = src[starts], dst[starts]
    length = torch.zeros(src.shape[0], dtype=torch.int64, device=dev).index_add_(0, run, length)
    # 2. word size: the lowest set bit of everything that must be word-aligned, at most 8
    bits = src | dst | length | (src_base | dst_base | 8)
    word = bits & -bits
    tables = []
    for w in (8, 4, 2, 1):
        pick = word == w
        if not bool(pick.any()):
            continue
        s, d, n = src[pick] // w, dst[pick] // w, length[pick] // w
        # 3. pieces of at most MAX_WIDTH words
        pieces = (n + MAX_WIDTH - 1) // MAX_WIDTH
        if int(pieces.max()) > 1:
            owner = torch.repeat_interleave(torch.arange(n.shape[0], device=dev), pieces)
            first = torch.cumsum(pieces, 0) - pieces
            k = torch.arange(owner.shape[0], device=dev) - first[owner]
            s, d = s[owner] + k * MAX_WIDTH, d[owner] + k * MAX_WIDTH
            n = torch.clamp(n[owner] - k * MAX_WIDTH, max=MAX_WIDTH)
        # 4. width classes
        lower = 0
        for width in WIDTHS:
            cls = (n > lower) & (n <= width)
            lower = width
            if bool(cls.any()):
                tables.append((w, width, s[cls].contiguous(), d[cls].contiguous(), n[cls].to(torch.int32)))
    return tables, src_low, dst_low


def run_triton(plan: CopyPlan, interpret: bool | None = None) -> None:
    """Copy the plan's segments with the Triton kernel (interpreted on CPU unless told otherwise)."""
    if plan.num_segments == 0:
        return
    on_cpu = plan.device.type == "cpu"
    if interpret is None:
        interpret = on_cpu
    if interpret != on_cpu or (not on_cpu and triton.knobs.runtime.interpret):
        # the interpreter copies only the kernel's own arguments to the host, not the other buffers
        # the offsets reach: it runs on CPU tensors only, and the compiled kernel on GPU ones only
        raise ValueError(f"the Triton {'interpreter' if interpret or not on_cpu else 'compiled kernel'} "
                         f"cannot run a plan on {plan.device}")
    cached = plan.cache.get("triton")
    if cached is None:
        cached = plan.cache["triton"] = launch_tables(plan)
    tables, src_low, dst_low = cached
    kernel = _kernel(interpret)
    src_t, dst_t = plan.src_buffers[src_low], plan.dst_buffers[dst_low]
    for w, width, s, d, n in tables:
        segs = max(1, TILE // width)
        grid = (triton.cdiv(n.shape[0], segs),)
        kernel[grid](triton.reinterpret(src_t, _WORD_DTYPES[w]), triton.reinterpret(dst_t, _WORD_DTYPES[w]),
                     s, d, n, n.shape[0], SEGS=segs, WIDTH=width)
