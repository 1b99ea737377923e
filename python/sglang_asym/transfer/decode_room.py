"""Per-request state on the decode side, and the checks D runs on P's completion."""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.checksum import crc_rows
from sglang_asym.transfer.extents import LANDING_POOL, ExtentBuffer, group_offsets
from sglang_asym.transfer.messages import GroupDestination, TransferComplete
from sglang_asym.transfer.poll import KVPoll
from sglang_asym.transfer.row_pool import RowPool
from sglang_asym.transfer.runs import coalesce_slots, pack_runs


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
    dest_runs: dict[str, np.ndarray] = field(default_factory=dict)  # dest_slots coalesced (for the CRC re-read)
    landing: np.ndarray | None = None  # a staged room's landing extent (blocks); its dest_slots are empty

    def runs(self, group: str) -> np.ndarray:
        if group not in self.dest_runs:
            self.dest_runs[group] = coalesce_slots(self.dest_slots[group])
        return self.dest_runs[group]

    def owned_slots(self) -> dict[str, np.ndarray]:
        """What the room holds on D, and what P's writes can reach: pool slots, or the landing extent."""
        return self.dest_slots if self.landing is None else {LANDING_POOL: self.landing}


def landed_rows(room: DecodeRoom, landing: ExtentBuffer, group: str) -> np.ndarray:
    """A staged room's rows of one group in its landing extent: a (num_rows, row_bytes) uint8 view."""
    assert room.landing is not None
    g = room.manifest.group(group)
    at = group_offsets(room.manifest)[group]
    return landing.bytes_of(room.landing)[at:at + g.nbytes].reshape(g.num_rows, g.row_bytes)


def destinations(room: DecodeRoom, pools: dict[str, RowPool]) -> tuple[GroupDestination, ...]:
    """Where P writes each group of a direct room: its pool slots (a staged room has none: the
    handshake gives its landing extent's address instead)."""
    if room.landing is not None:
        return ()
    return tuple(
        GroupDestination(g.name, pools[g.name].base_ptr, pools[g.name].num_slots, g.row_bytes,
                         pack_runs(room.runs(g.name)))
        for g in room.manifest.groups)


def completion_problem(room: DecodeRoom, msg: TransferComplete) -> str | None:
    """What is wrong with the completion's shape (groups, row counts), before any row is read."""
    names = [g.name for g in room.manifest.groups]
    if [c.group for c in msg.checksums] != names:
        return f"completion covers groups {[c.group for c in msg.checksums]}, manifest has {names}"
    for g, c in zip(room.manifest.groups, msg.checksums):
        if c.rows != g.num_rows:
            return f"partial transfer: group {g.name!r} has {c.rows} of {g.num_rows} rows"
    return None


def crc_problem(msg: TransferComplete, crcs: dict[str, int]) -> str | None:
    """The first group whose destination CRC differs from P's, as a reason; None if all match."""
    for c in msg.checksums:
        if crcs[c.group] != c.crc32c:
            return (f"checksum mismatch in group {c.group!r}: destination rows crc32c={crcs[c.group]:#010x}, "
                    f"prefill sent crc32c={c.crc32c:#010x}")
    return None


def verify_completion(room: DecodeRoom, msg: TransferComplete, pools: dict[str, RowPool],
                      executor: Executor) -> str | None:
    """None when every group has all its rows and their CRC matches P's; else the reason.
    The destination rows are re-read now, after the last write: this checks their final state."""
    problem = completion_problem(room, msg)
    if problem is not None:
        return problem
    futures = {g.name: executor.submit(crc_rows, pools[g.name], room.dest_slots[g.name]) for g in room.manifest.groups}
    return crc_problem(msg, {name: f.result() for name, f in futures.items()})
