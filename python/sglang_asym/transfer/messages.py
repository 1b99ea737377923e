"""Control messages between the prefill worker P and the decode worker D (over ZMQ).

Per request (bootstrap_room):
    D -> P  TransferRequest   compat, manifest, destination pools and slot runs (or one landing
                              extent), D's endpoints
    P -> D  TransferAccept    (or TransferReject with the reason; P then never writes)
            ... P writes rows with Mooncake, possibly chunk by chunk ...
    P -> D  TransferComplete  per-group row counts + CRC32C of the rows in row order
    D -> P  TransferVerdict   ok after D re-checked its destination rows, else the reason
Failures:
    P -> D  PrefillFailed     reason; writes_stopped says whether P is sure no write can still land
    D -> P  DecodeAbort       reason; P stops writing and answers PrefillFailed(writes_stopped=True)
Liveness (per peer, not per room): D sends Ping to every P it waits on, P answers Pong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.checksum import GroupChecksum
from sglang_asym.transfer.codec import message
from sglang_asym.transfer.compat import TransferCompat
from sglang_asym.transfer.runs import coalesce_slots, expand_runs, pack_runs, unpack_runs

MAX_ROOM = 1 << 63


def check_room(room: int) -> int:
    if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room < MAX_ROOM:
        raise ValueError(f"bootstrap_room must be an int in [0, 2^63), got {room!r}")
    return room


@dataclass(frozen=True)
class GroupDestination:
    """Where D wants one group's rows: row i of the group goes to the i-th slot of the runs.

    `runs` is packed (little-endian int64 pairs: first slot, number of slots) because a long
    prompt on a fragmented pool has thousands of runs."""

    group: str
    base_ptr: int
    capacity_slots: int
    row_bytes: int
    runs: bytes

    @classmethod
    def for_slots(cls, group: str, base_ptr: int, capacity_slots: int, row_bytes: int,
                  slots: np.ndarray) -> "GroupDestination":
        return cls(group, base_ptr, capacity_slots, row_bytes, pack_runs(coalesce_slots(slots)))

    def slots(self) -> np.ndarray:
        """Destination slot of every row, in row order (ValueError if the runs are malformed)."""
        return expand_runs(unpack_runs(self.runs))


@message("transfer_request")
@dataclass(frozen=True)
class TransferRequest:
    room: int
    decode_endpoint: str
    decode_session: str
    compat: TransferCompat
    manifest: PayloadManifest
    destinations: tuple[GroupDestination, ...]  # empty when `landing` is given
    landing: int | None = None  # address of D's landing extent for the room: every group's rows back to back
    #                             at extents.group_offsets (no slot runs then); P may write it in any pieces


@message("transfer_accept")
@dataclass(frozen=True)
class TransferAccept:
    room: int
    prefill_endpoint: str
    compat: TransferCompat


@message("transfer_reject")
@dataclass(frozen=True)
class TransferReject:
    room: int
    reason: str


@message("transfer_complete")
@dataclass(frozen=True)
class TransferComplete:
    room: int
    checksums: tuple[GroupChecksum, ...]


@message("transfer_verdict")
@dataclass(frozen=True)
class TransferVerdict:
    room: int
    ok: bool
    reason: str


@message("prefill_failed")
@dataclass(frozen=True)
class PrefillFailed:
    room: int
    reason: str
    writes_stopped: bool


@message("decode_abort")
@dataclass(frozen=True)
class DecodeAbort:
    room: int
    reason: str
    decode_endpoint: str


@message("ping")
@dataclass(frozen=True)
class Ping:
    decode_endpoint: str


@message("pong")
@dataclass(frozen=True)
class Pong:
    prefill_endpoint: str
