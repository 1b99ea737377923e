"""Per-request handle on the decode side (what SGLang calls a KVReceiver).

    receiver = manager.create_receiver(bootstrap_host, bootstrap_port, room, manifest)
    while receiver.poll() not in (KVPoll.Success, KVPoll.Failed): ...
    on Success: receiver.rows(group) has the rows (a staged room's live in its landing extent, a
                direct room's in receiver.dest_slots: row i of a group in its i-th slot);
                the caller owns them until receiver.release().
    on Failed:  the manager already freed (or quarantined) the slots; release() is a no-op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.poll import KVPoll

if TYPE_CHECKING:
    from sglang_asym.transfer.decode_manager import DecodeTransferManager
    from sglang_asym.transfer.decode_room import DecodeRoom


class Receiver:
    def __init__(self, manager: "DecodeTransferManager", room: "DecodeRoom"):
        self._manager = manager
        self._room = room

    @property
    def bootstrap_room(self) -> int:
        return self._room.room

    @property
    def manifest(self) -> PayloadManifest:
        return self._room.manifest

    @property
    def dest_slots(self) -> dict[str, np.ndarray]:
        """The pool slots of a direct room (empty for a staged one)."""
        return self._room.dest_slots

    @property
    def staged(self) -> bool:
        return self._room.landing is not None

    def rows(self, group: str) -> np.ndarray:
        """The group's rows after Success, (num_rows, row_bytes); valid until release()."""
        return self._manager.rows(self._room, group)

    def poll(self) -> KVPoll:
        return self._room.state

    @property
    def failure_reason(self) -> str:
        return self._room.reason

    @property
    def seconds_to_outcome(self) -> float | None:
        """Seconds from create_receiver to Success/Failed (None while in flight)."""
        r = self._room
        return r.finished_at - r.created_at if r.state.is_terminal else None

    @property
    def finished_at(self) -> float | None:
        """time.monotonic() when the room became Success/Failed (None while in flight)."""
        return self._room.finished_at if self._room.state.is_terminal else None

    def abort(self, reason: str = "aborted by decode") -> None:
        self._manager.abort(self._room, reason)

    def release(self) -> None:
        """Give the rows of a Success room back to the pool (the request is done with them)."""
        self._manager.release(self._room)
