"""A CPU-checkable guard that code is CUDA-graph capturable: no host syncs, no data-dependent shapes.

Inside `no_host_sync()` every aten op is inspected; ops that read a tensor's value on the host
(`.item()`, `bool(t)`, `.tolist()`) or whose output shape depends on tensor values (nonzero,
unique, masked_select, boolean-mask indexing, repeat_interleave by a tensor) raise CaptureUnsafe.
Such code cannot be replayed by a CUDA graph, so checking it on CPU catches it before a GPU run.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class CaptureUnsafe(RuntimeError):
    """An op that a CUDA graph cannot capture ran inside a capture-safe region."""


_SYNCING = {
    aten._local_scalar_dense, aten.is_nonzero, aten.equal, aten.nonzero, aten.argwhere, aten.masked_select,
    aten._unique, aten._unique2, aten.unique_dim, aten.unique_consecutive, aten.unique_dim_consecutive,
}
_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


def _has_bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


class _Guard(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in _SYNCING:
            raise CaptureUnsafe(f"{func} reads tensor values on the host or has a data-dependent shape")
        if packet in _INDEXING and _has_bool_index(args):
            raise CaptureUnsafe(f"{func} with a boolean mask has a data-dependent shape")
        if packet is aten.repeat_interleave and isinstance(args[0], torch.Tensor) and (
                len(args) == 1 or isinstance(args[1], torch.Tensor)) and kwargs.get("output_size") is None:
            raise CaptureUnsafe(f"{func} by a tensor of repeats has a data-dependent shape")
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Raise CaptureUnsafe on any host sync or data-dependent shape inside the block."""
    original_tolist = torch.Tensor.tolist

    def tolist(self):  # not an aten op: the dispatch mode cannot see it
        raise CaptureUnsafe("Tensor.tolist() copies tensor values to the host")

    torch.Tensor.tolist = tolist
    try:
        with _Guard():
            yield
    finally:
        torch.Tensor.tolist = original_tolist
