"""Helpers of the loopback agents: picklable manifests, a deterministic row pattern,
fragmented allocators, and polling a Sender/Receiver until a state."""

from __future__ import annotations

import time
import zlib

import numpy as np

from sglang_asym.manifest import PayloadManifest, RowGroup
from sglang_asym.transfer.compat import TransferCompat
from sglang_asym.transfer.row_pool import RowPool
from sglang_asym.transfer.slots import SlotAllocator

GroupSpec = tuple[str, int, int]  # (name, row_bytes, num_rows), picklable manifest form


def manifest_from(groups: list[GroupSpec]) -> PayloadManifest:
    return PayloadManifest(tuple(RowGroup(n, b, r) for n, b, r in groups))


def pattern_rows(seed: int, group: str, num_rows: int, row_bytes: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(group.encode())])
    return rng.integers(0, 256, size=(num_rows, row_bytes), dtype=np.uint8)


def churned_allocator(name: str, capacity: int, block: int, seed: int) -> SlotAllocator:
    """An allocator whose free list was shuffled in blocks: allocations come back as runs of
    `block` slots in random order (non-contiguous, but coalescible)."""
    alloc = SlotAllocator(name, capacity)
    blocks = np.array_split(alloc.allocate(capacity), max(1, capacity // block))
    for i in np.random.default_rng(seed).permutation(len(blocks)):
        alloc.free(blocks[i])
    return alloc


def make_pools(compat: TransferCompat, capacities: dict[str, int]) -> dict[str, RowPool]:
    return {n: RowPool.zeros(n, c, compat.row_format(n).row_bytes) for n, c in capacities.items()}


def wait_for(handle, states: list[int], timeout_s: float, interval_s: float = 0.0002) -> tuple[int, str, float]:
    start = time.monotonic()
    while handle.poll() not in states and time.monotonic() - start < timeout_s:
        time.sleep(interval_s)
    return int(handle.poll()), handle.failure_reason, time.monotonic() - start
