"""Where every destination slot of the decode worker is: free, held by an active room,
quarantined after a failure, or handed over to the caller after a Success."""

from __future__ import annotations

import threading

import numpy as np

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.errors import SlotsExhaustedError
from sglang_asym.transfer.quarantine import Quarantine
from sglang_asym.transfer.slot_pool import SlotAllocator

Slots = dict[str, np.ndarray]


class DecodeSlots:
    def __init__(self, allocators: dict[str, SlotAllocator]):
        self.allocators = allocators
        self.quarantine = Quarantine()
        self._handed_over: dict[int, Slots] = {}
        # One lock over every move between owners, so a report never sees a slot in transit.
        self._lock = threading.RLock()

    def allocate(self, manifest: PayloadManifest) -> Slots:
        """All groups or none: a shortage in one group frees what the others took."""
        with self._lock:
            taken: Slots = {}
            try:
                for g in manifest.groups:
                    if g.name not in self.allocators:
                        raise ValueError(f"manifest group {g.name!r} has no destination pool on this decode worker")
                    taken[g.name] = self.allocators[g.name].allocate(g.num_rows)
            except (SlotsExhaustedError, ValueError):
                self.free(taken)
                raise
            return taken

    def free(self, slots: Slots) -> None:
        with self._lock:
            for group, s in slots.items():
                self.allocators[group].free(s)

    def hold(self, room: int, slots: Slots, release_at: float) -> None:
        with self._lock:
            self.quarantine.hold(room, slots, release_at)

    def release_quarantine(self, room: int) -> bool:
        with self._lock:
            held = self.quarantine.release(room)
            if held is not None:
                self.free(held.slots)
            return held is not None

    def expire(self, now: float) -> int:
        with self._lock:
            due = self.quarantine.expire(now)
            for held in due:
                self.free(held.slots)
            return len(due)

    def hand_over(self, room: int, slots: Slots) -> None:
        with self._lock:
            self._handed_over[room] = slots

    def take_back(self, room: int) -> None:
        with self._lock:
            slots = self._handed_over.pop(room, None)
            if slots is not None:
                self.free(slots)

    def holders(self, pool: str, active: list[Slots]) -> int:
        """How many owners (open rooms in `active`, quarantined rooms, handed-over rooms) hold slots of `pool`."""
        with self._lock:
            owners = active + [held.slots for held in self.quarantine.held()] + list(self._handed_over.values())
            return sum(1 for slots in owners if len(slots.get(pool, ())) > 0)

    def report(self, active: list[Slots]) -> dict[str, dict[str, int]]:
        with self._lock:
            return self._report(active)

    def _report(self, active: list[Slots]) -> dict[str, dict[str, int]]:
        quarantined = self.quarantine.rows_by_group()
        handed = list(self._handed_over.values())
        out = {}
        for name, alloc in self.allocators.items():
            out[name] = {
                "capacity": alloc.capacity, "free": alloc.num_free,
                "active": sum(len(s.get(name, ())) for s in active),
                "quarantined": quarantined.get(name, 0),
                "handed_over": sum(len(s.get(name, ())) for s in handed),
            }
        return out

    def check_no_leaks(self, active: list[Slots]) -> None:
        """Every allocated slot is accounted for by exactly one owner."""
        with self._lock:
            report = self._report(active)
        for name, row in report.items():
            self.allocators[name].check_consistent()
            owned = row["active"] + row["quarantined"] + row["handed_over"]
            if row["capacity"] - row["free"] != owned:
                raise AssertionError(f"pool {name!r} leaks: {row['capacity'] - row['free']} allocated but "
                                     f"{owned} accounted for ({row})")
