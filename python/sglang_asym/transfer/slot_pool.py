"""Slot allocator for one destination pool.

A LIFO free list: a fresh allocator hands out 0, 1, 2, ... but after frees the order
follows the frees, so one allocation may be non-contiguous (the transfer coalesces runs).
An ownership mask catches double frees and lets `check_consistent` prove nothing leaked.
The free list is a numpy stack, so allocating a long prompt's rows is one slice, not a
Python list of ints.
"""

from __future__ import annotations

import threading

import numpy as np

from sglang_asym.transfer.errors import SlotsExhaustedError


class SlotAllocator:
    def __init__(self, name: str, capacity: int):
        if capacity <= 0:
            raise ValueError(f"SlotAllocator {name!r}: capacity must be positive, got {capacity}")
        self.name = name
        self.capacity = capacity
        self._stack = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # free slots; the top is the end
        self._top = capacity                                            # number of free slots
        self._owned = np.zeros(capacity, dtype=bool)
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def num_allocated(self) -> int:
        return self.capacity - self._top

    def allocate(self, n: int) -> np.ndarray:
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        with self._lock:
            if n > self._top:
                raise SlotsExhaustedError(
                    f"pool {self.name!r}: need {n} slots, {self._top} of {self.capacity} free")
            taken = self._stack[self._top - n:self._top][::-1].copy()
            self._top -= n
            self._owned[taken] = True
            return taken

    def free(self, slots) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) == 0:
            return
        with self._lock:
            if int(slots.min()) < 0 or int(slots.max()) >= self.capacity:
                raise ValueError(f"pool {self.name!r}: freeing slot out of range [0, {self.capacity})")
            if len(np.unique(slots)) != len(slots) or not self._owned[slots].all():
                raise ValueError(f"pool {self.name!r}: double free or free of a slot never allocated")
            self._owned[slots] = False
            self._stack[self._top:self._top + len(slots)] = slots[::-1]
            self._top += len(slots)

    def check_consistent(self) -> None:
        """Every slot is either free (exactly once) or owned, never both."""
        with self._lock:
            free = self._stack[:self._top]
            if len(np.unique(free)) != len(free):
                raise AssertionError(f"pool {self.name!r}: a slot is on the free list twice")
            if self._owned[free].any():
                raise AssertionError(f"pool {self.name!r}: a free slot is also owned")
            if len(free) + int(self._owned.sum()) != self.capacity:
                raise AssertionError(f"pool {self.name!r}: {len(free)} free + {int(self._owned.sum())} owned "
                                     f"!= capacity {self.capacity}")
