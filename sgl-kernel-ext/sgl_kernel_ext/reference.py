"""The torch reference of a copy plan: index ops, one gather and one indexed store per (source
buffer, destination buffer, segment length), through overlapping-window views of the buffers
(window i of a length-L view is bytes [i, i + L)), so no per-byte index is built; where all
offsets of a class share their residue modulo L, plain non-overlapping rows instead (faster).

Every source window is read before anything of the same class is written; plans never overlap
sources with destinations (plan.py refuses it), so the order of classes does not matter.
"""

from __future__ import annotations

import torch

from .plan import CopyPlan


def _rows(flat: torch.Tensor, length: int, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A [k, length] view of `flat` and the row of each offset in it: plain rows when every offset
    sits at the same residue modulo `length` (a row table, or one part of a strided page layout),
    else the overlapping windows of every start byte."""
    residue = offsets % length
    c = int(residue[0])
    if bool((residue == c).all()):
        k = (flat.numel() - c) // length
        return flat[c:c + k * length].view(k, length), (offsets - c) // length
    return flat.as_strided((flat.numel() - length + 1, length), (1, 1)), offsets


def run_reference(plan: CopyPlan) -> None:
    if plan.num_segments == 0:
        return
    classes = plan.cache.get("reference")
    if classes is None:
        longest, num_dst = int(plan.length.max()) + 1, len(plan.dst_buffers)
        key = (plan.src_buf * num_dst + plan.dst_buf) * longest + plan.length
        uniq, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
        order = torch.argsort(inverse, stable=True)
        classes = []
        for k, idx in zip(uniq.tolist(), torch.split(order, counts.tolist())):
            src_buf, dst_buf, length = k // longest // num_dst, k // longest % num_dst, k % longest
            src_view, src_rows = _rows(plan.src_buffers[src_buf], length, plan.src_off[idx])
            dst_view, dst_rows = _rows(plan.dst_buffers[dst_buf], length, plan.dst_off[idx])
            classes.append((src_view, src_rows, dst_view, dst_rows))
        plan.cache["reference"] = classes
    for src_view, src_rows, dst_view, dst_rows in classes:
        dst_view.index_put_((dst_rows,), src_view.index_select(0, src_rows))
