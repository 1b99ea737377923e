"""Who owns each destination row slot: a pool's allocator, the quarantine of failed rooms, and the decode worker's ledger over both.

  SlotAllocator  one pool's free list. A LIFO numpy stack: a fresh allocator hands out 0, 1, 2, ... but
                 after frees the order follows the frees, so one allocation may be non-contiguous (the
                 transfer coalesces runs). An ownership mask catches double frees and lets
                 `check_consistent` prove nothing leaked; allocating a long prompt's rows is one slice.
  Quarantine     rows of failed rooms that a late write could still reach. A Mooncake -1 does not mean
                 nothing was written, and a frozen or slow P may still have a write in flight: the rows
                 stay held until P confirms it stopped writing to the room, or a grace period has passed,
                 and only then go back to the free list (earlier, a late write would corrupt the NEXT
                 request that gets the same slots).
  DecodeSlots    where every destination slot of the decode worker is: free, held by an active room,
                 quarantined after a failure, or handed over to the caller after a Success.
P's source slots use SlotAllocator alone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.errors import SlotsExhaustedError

Slots = dict[str, np.ndarray]


class SlotAllocator:
    """The free list of one pool's row slots."""

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


@dataclass(frozen=True)
class HeldRows:
    """One failed room's slots in quarantine, and when they may go back to the free list."""

    room: int
    slots: Slots
    release_at: float

    @property
    def num_rows(self) -> int:
        return sum(len(s) for s in self.slots.values())


class Quarantine:
    """The held rows of failed rooms, by room."""

    def __init__(self) -> None:
        self._held: dict[int, HeldRows] = {}
        self._lock = threading.Lock()

    def hold(self, room: int, slots: Slots, release_at: float) -> None:
        with self._lock:
            if room in self._held:
                raise ValueError(f"bootstrap_room={room} already has rows in quarantine")
            self._held[room] = HeldRows(room, slots, release_at)

    def release(self, room: int) -> HeldRows | None:
        """P confirmed it stopped writing to `room`: its rows may be freed now."""
        with self._lock:
            return self._held.pop(room, None)

    def expire(self, now: float) -> list[HeldRows]:
        with self._lock:
            due = [h for h in self._held.values() if h.release_at <= now]
            for h in due:
                del self._held[h.room]
            return due

    def held(self) -> list[HeldRows]:
        with self._lock:
            return list(self._held.values())

    def rows_by_group(self) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for held in self._held.values():
                for group, slots in held.slots.items():
                    counts[group] = counts.get(group, 0) + len(slots)
            return counts

    def __contains__(self, room: int) -> bool:
        with self._lock:
            return room in self._held

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


class DecodeSlots:
    """The decode worker's ledger: every slot of its pools is free, active, quarantined or handed over."""

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
