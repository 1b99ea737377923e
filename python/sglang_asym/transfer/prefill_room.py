"""Per-request state on the prefill side, and the pure checks and address math it needs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.checksum import RunningChecksums
from sglang_asym.transfer.extents import group_offsets
from sglang_asym.transfer.messages import GroupDestination, TransferRequest
from sglang_asym.transfer.poll import KVPoll
from sglang_asym.transfer.row_pool import RowPool
from sglang_asym.transfer.runs import expand_runs, paired_runs, run_rows, unpack_runs
from sglang_asym.transfer.staging import StagingExtent, split_for_lanes


@dataclass
class PrefillRoom:
    room: int
    manifest: PayloadManifest
    source_slots: dict[str, np.ndarray]
    created_at: float
    state: KVPoll = KVPoll.Bootstrapping
    reason: str = ""
    request: TransferRequest | None = None           # D's handshake once bound
    bound_at: float = 0.0
    request_arrived_at: float = 0.0                  # monotonic: D's handshake came off the socket
    finished_at: float = 0.0                         # monotonic: finish() (every row handed over)
    dest_slots: dict[str, np.ndarray] = field(default_factory=dict)
    declared: dict[str, int] = field(default_factory=dict)   # rows handed to send_rows, per group
    pending_ranges: list[tuple[str, int, int]] = field(default_factory=list)  # declared, not yet written
    flush_queued: bool = False                       # a write task for pending_ranges is queued
    finished: bool = False
    written: dict[str, int] = field(default_factory=dict)    # rows the engine confirmed, per group
    checksums: RunningChecksums | None = None        # CRCs of the declared rows, folded in as they come
    pending_tasks: int = 0                           # worker tasks queued or running for this room
    write_failed: bool = False                       # a -1 happened: a late write may still land on D
    source_rows: "SourceRows | None" = None          # every row's source address (built by create_sender)
    staging: StagingExtent | None = None             # where send_rows copies the rows (until the room is dropped)
    staged: bool = False                             # the room got a staging extent (kept after the drop)
    row_table: "RowTable | None" = None              # + every row's destination, built at the first write

    def __post_init__(self) -> None:
        for g in self.manifest.groups:
            self.declared[g.name] = 0
            self.written[g.name] = 0

    @property
    def bound(self) -> bool:
        return self.request is not None

    @property
    def transfer_phase_start(self) -> float:
        """Monotonic time P first held both every row (finish()) and D's destinations (the handshake
        off the socket, before P decoded it); 0.0 until both happened."""
        if not (self.finished and self.bound):
            return 0.0
        return max(self.finished_at, self.request_arrived_at)

    @property
    def whole_extents(self) -> bool:
        """Source and destination are one registered extent each (P's staging, D's landing): a write's
        entries may run across groups."""
        return self.staging is not None and self.request is not None and self.request.landing is not None

    @property
    def drained(self) -> bool:
        return self.state.is_terminal and self.pending_tasks == 0

    def declare_rows(self, group: str, row_start: int, row_end: int) -> bool:
        """Record rows handed to send_rows; True when there is something new to write."""
        total = self.manifest.group(group).num_rows
        if self.finished:
            raise ValueError(f"bootstrap_room={self.room}: send_rows after finish()")
        if row_start != self.declared[group] or not row_start <= row_end <= total:
            raise ValueError(f"bootstrap_room={self.room} group {group!r}: rows must be sent in order; "
                             f"next row is {self.declared[group]}, got [{row_start}, {row_end}) of {total}")
        if self.state == KVPoll.Failed or row_start == row_end:
            return False
        self.declared[group] = row_end
        self.pending_ranges.append((group, row_start, row_end))
        return True

    def mark_finished(self) -> bool:
        """Record finish(); True the first time on a live room."""
        missing = [f"{g.name} ({self.declared[g.name]}/{g.num_rows})" for g in self.manifest.groups
                   if self.declared[g.name] != g.num_rows]
        if missing:
            raise ValueError(f"bootstrap_room={self.room}: finish() before all rows were sent: {missing}")
        if self.finished or self.state == KVPoll.Failed:
            return False
        self.finished = True
        self.finished_at = time.monotonic()
        return True

    def destination_base(self, group: str) -> int:
        """Address of D's slot 0 for the group (its pool, or its place in D's landing extent)."""
        assert self.request is not None
        if self.request.landing is not None:
            return self.request.landing + group_offsets(self.manifest)[group]
        return next(d for d in self.request.destinations if d.group == group).base_ptr


def check_source_slots(manifest: PayloadManifest, source_slots, pools: dict[str, RowPool]) -> dict[str, np.ndarray]:
    """Source slots per manifest group, validated against the group's pool."""
    extra = set(source_slots) - {g.name for g in manifest.groups}
    if extra:
        raise ValueError(f"source_slots has groups not in the manifest: {sorted(extra)}")
    checked = {}
    for g in manifest.groups:
        if g.name not in pools:
            raise ValueError(f"manifest group {g.name!r} has no source pool on this prefill worker")
        pool = pools[g.name]
        if pool.row_bytes != g.row_bytes:
            raise ValueError(f"group {g.name!r}: manifest rows are {g.row_bytes} B, pool rows {pool.row_bytes} B")
        slots = np.asarray(source_slots.get(g.name, ()), dtype=np.int64)
        if slots.ndim != 1 or len(slots) != g.num_rows:
            raise ValueError(f"group {g.name!r}: {g.num_rows} rows but {slots.size} source slots")
        pool.check_slots(slots, f"source slots of group {g.name!r}")
        checked[g.name] = slots
    return checked


def check_request(room: PrefillRoom, req: TransferRequest) -> dict[str, np.ndarray]:
    """Destination slots per group from D's handshake; ValueError names any disagreement."""
    if req.manifest != room.manifest:
        raise ValueError(f"payload manifest differs: prefill has {_describe(room.manifest)}, "
                         f"decode has {_describe(req.manifest)}")
    if req.landing is not None:  # one extent of D's, laid out as extents.group_offsets says
        if req.destinations:
            raise ValueError(f"a handshake with a landing extent must not list slot runs too "
                             f"({len(req.destinations)} groups listed)")
        if not 0 < req.landing <= (1 << 64) - room.manifest.total_bytes:
            raise ValueError(f"landing extent address {req.landing:#x} cannot hold {room.manifest.total_bytes} B")
        return {g.name: np.arange(g.num_rows, dtype=np.int64) for g in room.manifest.groups}
    names = [g.name for g in room.manifest.groups]
    if [d.group for d in req.destinations] != names:
        raise ValueError(f"decode destinations cover groups {[d.group for d in req.destinations]}, "
                         f"manifest has {names}")
    dest = _all_destination_slots(room.manifest, req.destinations)
    if dest is not None:
        return dest
    dest = {}  # something is wrong: the group-by-group checks below name it
    for g, d in zip(room.manifest.groups, req.destinations):
        try:
            runs = unpack_runs(d.runs)
            offered = run_rows(runs)  # counted before expanding: D's runs may claim any number of rows
        except ValueError as exc:
            raise ValueError(f"group {g.name!r}: malformed destination runs: {exc}") from exc
        if d.row_bytes != g.row_bytes or offered != g.num_rows:
            raise ValueError(f"group {g.name!r}: decode offers {offered} rows of {d.row_bytes} B, "
                             f"manifest needs {g.num_rows} rows of {g.row_bytes} B")
        slots = expand_runs(runs)
        if len(slots) and int(slots.max()) >= d.capacity_slots:
            raise ValueError(f"group {g.name!r}: decode slot {int(slots.max())} outside its pool "
                             f"of {d.capacity_slots} slots")
        dest[g.name] = slots
    return dest


def _all_destination_slots(manifest: PayloadManifest, destinations: tuple[GroupDestination, ...]
                           ) -> dict[str, np.ndarray] | None:
    """The destination slots of every group when the handshake is well formed, else None.
    One vectorised pass over all groups' runs (the handshake is on the transfer's critical path
    and numpy's per-call cost dominates small groups); `check_request` falls back to the
    group-by-group checks, which name the problem, whenever this returns None."""
    groups = manifest.groups
    blobs = [d.runs for d in destinations]
    if any(len(b) % 16 for b in blobs) or any(d.row_bytes != g.row_bytes for g, d in zip(groups, destinations)):
        return None
    runs = unpack_runs(b"".join(blobs))
    starts, lengths = runs[:, 0], runs[:, 1]
    if len(runs) and (int(starts.min()) < 0 or int(lengths.min()) <= 0):
        return None
    ends = np.cumsum(lengths)
    run_counts = [len(b) // 16 for b in blobs]
    run_bounds = np.cumsum([0] + run_counts)
    rows_so_far = np.concatenate(([0], ends))[run_bounds]          # rows before each group's first run
    if not np.array_equal(np.diff(rows_so_far), [g.num_rows for g in groups]):
        return None
    # Capacity per run (its last slot), not per row: runs are far fewer than rows. Written so that
    # no sum can overflow int64 (runs come off the wire).
    capacity = np.repeat(np.array([d.capacity_slots for d in destinations], dtype=np.int64), run_counts)
    if ((starts >= capacity) | (lengths > capacity - starts)).any():
        return None
    slots = np.repeat(starts - (ends - lengths), lengths) + np.arange(int(rows_so_far[-1]), dtype=np.int64)
    bounds = rows_so_far.tolist()
    return {g.name: slots[bounds[i]:bounds[i + 1]] for i, g in enumerate(groups)}


def _per_row(manifest: PayloadManifest, values: list[int]) -> np.ndarray:
    return np.repeat(np.array(values, dtype=np.uint64), [g.num_rows for g in manifest.groups])


@dataclass(frozen=True)
class SourceRows:
    """Source address and size of every row of a room, groups concatenated in manifest order
    (group g's row r at offsets[g] + r). Known before D's handshake, so built before it comes."""

    offsets: dict[str, int]
    src: np.ndarray   # uint64
    step: np.ndarray  # uint64 row bytes

    @classmethod
    def build(cls, manifest: PayloadManifest, slots: dict[str, np.ndarray], pools: dict[str, RowPool],
              staging: StagingExtent | None = None) -> "SourceRows":
        """The rows' pool slots, or for a staged room their places in its staging extent."""
        groups = manifest.groups
        step = _per_row(manifest, [pools[g.name].row_bytes for g in groups])
        if staging is None:
            index, bases = [slots[g.name] for g in groups], [pools[g.name].base_ptr for g in groups]
        else:
            index, bases = [np.arange(g.num_rows) for g in groups], [staging.base(g.name) for g in groups]
        src = np.concatenate(index or [np.zeros(0, dtype=np.int64)]).astype(np.uint64) * step \
            + _per_row(manifest, bases)
        offsets = dict(zip([g.name for g in groups], np.cumsum([0] + [g.num_rows for g in groups]).tolist()))
        return cls(offsets, src, step)


@dataclass(frozen=True)
class RowTable:
    """SourceRows plus every row's destination address: a write of any rows is slices of it."""

    offsets: dict[str, int]
    src: np.ndarray   # uint64
    dst: np.ndarray   # uint64
    step: np.ndarray  # uint64 row bytes

    @classmethod
    def build(cls, room: PrefillRoom, pools: dict[str, RowPool]) -> "RowTable":
        groups = room.manifest.groups
        source = room.source_rows or SourceRows.build(room.manifest, room.source_slots, pools, room.staging)
        dst = np.concatenate([room.dest_slots[g.name] for g in groups] or [np.zeros(0, dtype=np.int64)]
                             ).astype(np.uint64) * source.step \
            + _per_row(room.manifest, [room.destination_base(g.name) for g in groups])
        return cls(source.offsets, source.src, dst, source.step)


def write_entries(room: PrefillRoom, pool: RowPool, group: str, start: int, end: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src_ptrs, dst_ptrs, lengths) for rows [start, end) of `group`, coalesced into runs."""
    base = room.destination_base(group)
    src_runs, dst_runs, counts = paired_runs(room.source_slots[group][start:end], room.dest_slots[group][start:end])
    rb = pool.row_bytes
    src_ptrs = (np.uint64(pool.base_ptr) + src_runs.astype(np.uint64) * np.uint64(rb))
    dst_ptrs = (np.uint64(base) + dst_runs.astype(np.uint64) * np.uint64(rb))
    return src_ptrs, dst_ptrs, counts.astype(np.uint64) * np.uint64(rb)


def batch_entries(room: PrefillRoom, pools: dict[str, RowPool], ranges: list[tuple[str, int, int]]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`write_entries` of several (group, start, end) ranges, concatenated, in one vectorised pass
    over slices of the room's RowTable (built once, at the first write): a run continues while
    both addresses advance by one row and never crosses a range (pools of two groups may lie next
    to each other in memory, but an entry must stay inside one), except in a room with whole
    extents on both sides (`PrefillRoom.whole_extents`), whose runs go on across ranges and are
    then cut into pieces for the transport's lanes."""
    if room.whole_extents:
        return split_for_lanes(*_extent_entries(room, pools, ranges))
    if room.row_table is None:
        room.row_table = RowTable.build(room, pools)
    t = room.row_table
    spans = [(t.offsets[g] + s, t.offsets[g] + e) for g, s, e in ranges if e > s]
    if not spans:
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty, empty
    if all(a[1] == b[0] for a, b in zip(spans, spans[1:])):  # e.g. every group whole, in manifest order
        lo, hi = spans[0][0], spans[-1][1]
        src_a, dst_a, rb_a = t.src[lo:hi], t.dst[lo:hi], t.step[lo:hi]
    else:
        src_a, dst_a, rb_a = (np.concatenate([col[a:b] for a, b in spans]) for col in (t.src, t.dst, t.step))
    new_run = np.empty(len(src_a), dtype=bool)
    new_run[0] = True
    new_run[1:] = (src_a[1:] != src_a[:-1] + rb_a[:-1]) | (dst_a[1:] != dst_a[:-1] + rb_a[:-1])
    new_run[np.cumsum([b - a for a, b in spans[:-1]], dtype=np.int64)] = True
    first = np.flatnonzero(new_run)
    ends = np.empty_like(first)
    ends[:-1], ends[-1] = first[1:], len(src_a)
    return src_a[first], dst_a[first], (ends - first).astype(np.uint64) * rb_a[first]


def _extent_entries(room: PrefillRoom, pools: dict[str, RowPool], ranges: list[tuple[str, int, int]]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One entry per range from the staging extent to the landing extent (both laid out by
    extents.group_offsets), in extent order, neighbours merged (the ranges of one write may come
    in any order: a pipelined prefill hands them over group after group)."""
    assert room.staging is not None and room.request is not None
    offset = room.request.landing - room.staging.base(room.manifest.groups[0].name)  # landing - staging address
    pieces = sorted((room.staging.base(g) + s * pools[g].row_bytes, (e - s) * pools[g].row_bytes)
                    for g, s, e in ranges if e > s)
    src, dst, lengths = [], [], []
    for a, n in pieces:
        b = a + offset
        if src and src[-1] + lengths[-1] == a:
            lengths[-1] += n
        else:
            src.append(a), dst.append(b), lengths.append(n)
    return tuple(np.array(x, dtype=np.uint64) for x in (src, dst, lengths))


def _describe(manifest: PayloadManifest) -> str:
    return ", ".join(f"{g.name}:{g.num_rows}x{g.row_bytes}B" for g in manifest.groups) or "no rows"
