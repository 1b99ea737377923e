"""Per-request state on the decode side, and the checks D runs on P's completion."""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.checksum import crc_rows
from sglang_asym.transfer.messages import GroupDestination, TransferComplete
from sglang_asym.transfer.poll import KVPoll
from sglang_asym.transfer.row_pool import RowPool


@dataclass
class DecodeRoom:
    room: int
    bootstrap_addr: str
    manifest: PayloadManifest
    dest_slots: dict[str, np.ndarray]
    created_at: float
    state: KVPoll = KVPoll.Bootstrapping
    reason: str = ""
    peer: str | None = None          # P's control endpoint once resolved
    handshake_sent: bool = False     # from here on P may write into dest_slots
    accepted_at: float = 0.0
    verifying: bool = False
    finished_at: float = 0.0         # monotonic time of Success / Failed


def destinations(room: DecodeRoom, pools: dict[str, RowPool]) -> tuple[GroupDestination, ...]:
    return tuple(
        GroupDestination.for_slots(g.name, pools[g.name].base_ptr, pools[g.name].num_slots, g.row_bytes,
                                   room.dest_slots[g.name])
        for g in room.manifest.groups)


def verify_completion(room: DecodeRoom, msg: TransferComplete, pools: dict[str, RowPool],
                      executor: Executor) -> str | None:
    """None when every group has all its rows and their CRC matches P's; else the reason.
    The destination rows are re-read now, after the last write: this checks their final state."""
    names = [g.name for g in room.manifest.groups]
    if [c.group for c in msg.checksums] != names:
        return f"completion covers groups {[c.group for c in msg.checksums]}, manifest has {names}"
    for g, c in zip(room.manifest.groups, msg.checksums):
        if c.rows != g.num_rows:
            return f"partial transfer: group {g.name!r} has {c.rows} of {g.num_rows} rows"
    crcs = [executor.submit(crc_rows, pools[g.name], room.dest_slots[g.name]) for g in room.manifest.groups]
    for g, c, crc in zip(room.manifest.groups, msg.checksums, (f.result() for f in crcs)):
        if crc != c.crc32:
            return (f"checksum mismatch in group {g.name!r}: destination rows crc32={crc:#010x}, "
                    f"prefill sent crc32={c.crc32:#010x}")
    return None
