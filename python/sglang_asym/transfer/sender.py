"""Per-request handle on the prefill side (what SGLang calls a KVSender).

Typical use, with pipelining:
    sender = manager.create_sender(room, manifest, source_slots)
    for each prefill chunk: sender.send_rows(group, row_start, row_end)   # rows in order per group
    sender.finish()
    while sender.poll() not in (KVPoll.Success, KVPoll.Failed): ...
Rows may be sent before D has connected; they are written once the handshake binds.
Once poll() is terminal the transfer layer no longer needs the source rows, except that a
Failed room may still have one write in flight on the worker for a short while (D keeps
the destination rows quarantined, so reusing the source slots is harmless).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.poll import KVPoll

if TYPE_CHECKING:
    from sglang_asym.transfer.prefill_manager import PrefillTransferManager
    from sglang_asym.transfer.prefill_room import PrefillRoom


class Sender:
    def __init__(self, manager: "PrefillTransferManager", room: "PrefillRoom"):
        self._manager = manager
        self._room = room

    @property
    def bootstrap_room(self) -> int:
        return self._room.room

    @property
    def manifest(self) -> PayloadManifest:
        return self._room.manifest

    @property
    def staged(self) -> bool:
        """Whether the rows go out from a staging extent (else straight from their pool slots)."""
        return self._room.staged

    def poll(self) -> KVPoll:
        return self._room.state

    @property
    def failure_reason(self) -> str:
        return self._room.reason

    def send_rows(self, group: str, row_start: int, row_end: int) -> None:
        self._manager.send_rows(self._room, group, row_start, row_end)

    def finish(self) -> None:
        self._manager.finish(self._room)

    def send_all(self) -> None:
        """Send every row not sent yet, then finish (the non-pipelined path)."""
        for g in self._room.manifest.groups:
            self.send_rows(g.name, self.next_row(g.name), g.num_rows)
        self.finish()

    def abort(self, reason: str = "aborted by prefill") -> None:
        self._manager.abort(self._room, reason)

    def next_row(self, group: str) -> int:
        """Rows of `group` handed to send_rows so far (the next call must start here)."""
        return self._room.declared[group]

    def rows_written(self, group: str) -> int:
        """Rows of `group` the engine confirmed written to D (progress, for pipelining)."""
        return self._room.written[group]
