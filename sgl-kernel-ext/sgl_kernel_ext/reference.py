"""The torch reference of a copy plan: index ops, one gather and one store per (source buffer,
destination buffer, segment length) class, through [k, L] views of the flat buffers, so no per-byte
index is built. The view of one side of a class is, the first that applies:
  - a strided view when the offsets step evenly (a group's rows in wire order): a plain copy;
  - the plain rows of the buffer when every offset has the same residue modulo L (a row table, or one
    part of a page layout whose page size is a multiple of L): indexed by row;
  - the overlapping windows of every start byte (window i is bytes [i, i + L)): indexed by byte.
Every source row of a class is read before its destinations are written; plans never overlap sources
with destinations (plan.py refuses it), so the order of classes does not matter.
"""

from __future__ import annotations

import torch

from .plan import CopyPlan


def _view(flat: torch.Tensor, length: int, offsets: torch.Tensor, write: bool
          ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """([k, length] view, row of each offset in it or None when the view is already in order,
    whether the view's rows are disjoint)."""
    n, first = offsets.numel(), int(offsets[0])
    step = int(offsets[1] - offsets[0]) if n > 1 else length
    if step >= (length if write else 0) and (n == 1 or bool((offsets[1:] - offsets[:-1] == step).all())):
        return flat.as_strided((n, length), (step, 1), first), None, step >= length
    residue = offsets % length
    c = int(residue[0])
    if bool((residue == c).all()):
        k = (flat.numel() - c) // length
        return flat[c:c + k * length].view(k, length), (offsets - c) // length, True
    return flat.as_strided((flat.numel() - length + 1, length), (1, 1)), offsets, length == 1


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
            classes.append(_view(plan.src_buffers[src_buf], length, plan.src_off[idx], write=False)
                           + _view(plan.dst_buffers[dst_buf], length, plan.dst_off[idx], write=True))
        plan.cache["reference"] = classes
    for src_view, src_rows, _, dst_view, dst_rows, dst_disjoint in classes:
        rows = src_view if src_rows is None else src_view.index_select(0, src_rows)
        if dst_rows is None:
            dst_view.copy_(rows)
        elif dst_disjoint:
            dst_view.index_copy_(0, dst_rows, rows)
        else:   # overlapping windows: index_copy_ refuses them, index_put_ writes each row where told
            dst_view.index_put_((dst_rows,), rows)
