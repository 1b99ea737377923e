"""Destination rows of failed rooms that a late write could still reach.

A Mooncake -1 does not mean nothing was written, and a frozen or slow P may still have a
write in flight. Those rows are held here until P confirms it stopped writing to the room,
or until a grace period has passed, and only then go back to the free list: returning them
earlier lets a late write corrupt the NEXT request that gets the same slots.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HeldRows:
    room: int
    slots: dict[str, np.ndarray]
    release_at: float

    @property
    def num_rows(self) -> int:
        return sum(len(s) for s in self.slots.values())


class Quarantine:
    def __init__(self) -> None:
        self._held: dict[int, HeldRows] = {}
        self._lock = threading.Lock()

    def hold(self, room: int, slots: dict[str, np.ndarray], release_at: float) -> None:
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
