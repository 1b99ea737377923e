"""Staged transfers without an engine: the extent allocator, P's staging extent, the wire entries of a
room with whole extents on both sides, a landing handshake's checks, and D's view of landed rows."""

from __future__ import annotations

import numpy as np
import pytest
from crc32c import crc32c
from transfer_cases import COMPAT

from sglang_asym.manifest import PayloadManifest, RowGroup
from sglang_asym.transfer import RowPool
from sglang_asym.transfer.decode_room import DecodeRoom, destinations, landed_rows
from sglang_asym.transfer.errors import SlotsExhaustedError
from sglang_asym.transfer.extents import BLOCK, LANDING_POOL, ExtentAllocator, ExtentBuffer, group_offsets
from sglang_asym.transfer.messages import GroupDestination, TransferRequest
from sglang_asym.transfer.prefill_room import PrefillRoom, SourceRows, batch_entries, check_request
from sglang_asym.transfer.regions import RegisteredRegions
from sglang_asym.transfer.staging import MIN_PIECE_BYTES, WRITE_PIECES, StagingExtent, split_for_lanes

MANIFEST = PayloadManifest((RowGroup("kv", 288, 7), RowGroup("index", 68, 7), RowGroup("tails", 4096, 0),
                            RowGroup("tail", 4096, 2)))


def test_extent_allocator_first_fit_merges_and_refuses() -> None:
    alloc = ExtentAllocator("landing", 100)
    a, b, c = alloc.allocate(30), alloc.allocate(30), alloc.allocate(30)
    assert (a.tolist(), b[0], c[-1], alloc.num_free) == (list(range(30)), 30, 89, 10)
    with pytest.raises(SlotsExhaustedError, match=r"pool 'landing': no free run of 11 blocks \(10 of 100 free"):
        alloc.allocate(11)
    alloc.free(b)
    with pytest.raises(SlotsExhaustedError, match="no free run of 31 blocks"):  # 40 free, but in two runs
        alloc.allocate(31)
    assert alloc.allocate(5).tolist() == list(range(30, 35))  # first fit: the lowest run that holds it
    alloc.free(np.arange(30, 35))
    alloc.free(a)  # merges with the run after it: [0, 60)
    assert alloc.allocate(60).tolist() == list(range(60))
    alloc.check_consistent()
    with pytest.raises(ValueError, match="double free or free of a block never allocated"):
        alloc.free(np.arange(90, 95))
    with pytest.raises(ValueError, match="can only free one run"):
        alloc.free(np.array([0, 2]))
    alloc.free(c)
    alloc.free(np.arange(60))
    assert alloc.num_free == 100 and alloc.allocate(100).tolist() == list(range(100))
    assert alloc.allocate(0).tolist() == []


def test_extent_buffer_reserves_whole_blocks() -> None:
    buf = ExtentBuffer(LANDING_POOL, 10 * BLOCK + 5)  # the odd bytes are not used
    assert buf.allocator.capacity == 10 and buf.pool.nbytes == 10 * BLOCK
    blocks = buf.reserve(BLOCK + 1)
    assert blocks.tolist() == [0, 1] and buf.address(blocks) == buf.base_ptr
    assert buf.reserve(9 * BLOCK) is None and buf.reserve(0) is None
    view = buf.bytes_of(blocks)
    view[:] = 7
    assert buf.pool.array.reshape(-1)[:2 * BLOCK].tolist() == [7] * (2 * BLOCK)
    with pytest.raises(ValueError, match="landing buffer needs at least 64 bytes, got 63"):
        ExtentBuffer(LANDING_POOL, 63)


def test_group_offsets_lay_groups_back_to_back() -> None:
    assert group_offsets(MANIFEST) == {"kv": 0, "index": 7 * 288, "tails": 7 * 288 + 7 * 68, "tail": 7 * 288 + 7 * 68}


def test_staging_copy_and_source_addresses() -> None:
    pools = {g.name: RowPool.zeros(g.name, 16, g.row_bytes) for g in MANIFEST.groups}
    for p in pools.values():
        p.array[:] = np.random.default_rng(len(p.name)).integers(0, 256, p.array.shape, dtype=np.uint8)
    slots = {"kv": np.array([9, 3, 4, 5, 0, 15, 8]), "index": np.arange(7), "tails": np.zeros(0, dtype=np.int64),
             "tail": np.array([2, 1])}
    staging = StagingExtent.reserve(ExtentBuffer("staging", 64 << 10), MANIFEST)
    for g in MANIFEST.groups:
        cut = min(3, g.num_rows)
        staging.copy_in(pools[g.name], g.name, slots[g.name], 0, cut)
        staging.copy_in(pools[g.name], g.name, slots[g.name], cut, g.num_rows)
        assert np.array_equal(staging.rows(g.name, g.row_bytes, 0, g.num_rows), pools[g.name].array[slots[g.name]])
    src = SourceRows.build(MANIFEST, slots, pools, staging).src
    assert src.tolist() == [staging.base(g.name) + r * g.row_bytes for g in MANIFEST.groups for r in range(g.num_rows)]
    assert src[0] == staging.buffer.base_ptr and src[7] == staging.buffer.base_ptr + 7 * 288
    staging.free()
    assert staging.buffer.allocator.num_free == staging.buffer.allocator.capacity


def test_split_for_lanes_cuts_large_entries_into_equal_pieces() -> None:
    one = np.array([1 << 40], dtype=np.uint64), np.array([1 << 41], dtype=np.uint64)
    small = split_for_lanes(*one, np.array([300_000], dtype=np.uint64))
    assert [x.tolist() for x in small] == [[1 << 40], [1 << 41], [300_000]]  # below a piece: kept whole
    total = 4 * MIN_PIECE_BYTES + 10
    src, dst, lengths = split_for_lanes(*one, np.array([total], dtype=np.uint64))
    assert len(lengths) == WRITE_PIECES and int(lengths.sum()) == total
    assert (src - (1 << 40)).tolist() == (dst - (1 << 41)).tolist() == np.cumsum([0, *lengths[:-1]]).tolist()
    assert lengths.tolist() == [-(-total // 4)] * 3 + [total - 3 * -(-total // 4)]  # equal cuts, the last shorter
    # the lane share comes from the whole write: an entry below it stays whole
    two = split_for_lanes(np.array([0, 10 << 20], dtype=np.uint64), np.array([0, 20 << 20], dtype=np.uint64),
                          np.array([8 << 20, 1 << 20], dtype=np.uint64))
    assert two[2].tolist() == [2 << 20] * 4 + [1 << 20]
    assert two[0].tolist() == [0, 2 << 20, 4 << 20, 6 << 20, 10 << 20]
    assert two[1].tolist() == [0, 2 << 20, 4 << 20, 6 << 20, 20 << 20]


def _staged_room(landing: int | None) -> tuple[PrefillRoom, dict[str, RowPool]]:
    pools = {g.name: RowPool.zeros(g.name, 16, g.row_bytes) for g in MANIFEST.groups}
    slots = {"kv": np.arange(7) * 2, "index": np.arange(7), "tails": np.zeros(0, dtype=np.int64), "tail": np.array([3, 5])}
    room = PrefillRoom(4, MANIFEST, slots, created_at=0.0)
    room.staging = StagingExtent.reserve(ExtentBuffer("staging", 64 << 10), MANIFEST)
    room.source_rows = SourceRows.build(MANIFEST, slots, pools, room.staging)
    dests = () if landing is not None else tuple(
        GroupDestination.for_slots(g.name, (1 << 40) + i * (1 << 20), 64, g.row_bytes, np.arange(g.num_rows) + 3)
        for i, g in enumerate(MANIFEST.groups))
    room.request = TransferRequest(4, "tcp://d", "127.0.0.1:1", COMPAT, MANIFEST, dests, landing)
    room.dest_slots = check_request(room, room.request)
    return room, pools


def test_whole_extents_write_one_entry_per_contiguous_stretch() -> None:
    room, pools = _staged_room(landing=1 << 42)
    assert room.whole_extents and room.dest_slots["kv"].tolist() == list(range(7))
    everything = [(g.name, 0, g.num_rows) for g in MANIFEST.groups]
    src, dst, lengths = batch_entries(room, pools, everything)
    assert (src.tolist(), dst.tolist(), lengths.tolist()) == ([room.staging.base("kv")], [1 << 42],
                                                              [MANIFEST.total_bytes])
    # chunks of a pipelined prefill, handed over group after group: sorted into extent order and merged
    src, dst, lengths = batch_entries(room, pools, [("kv", 0, 2), ("index", 0, 2), ("kv", 2, 7)])
    assert (dst.tolist(), lengths.tolist()) == ([1 << 42], [7 * 288 + 2 * 68])
    src, dst, lengths = batch_entries(room, pools, [("index", 3, 5), ("kv", 0, 2)])
    assert dst.tolist() == [1 << 42, (1 << 42) + 7 * 288 + 3 * 68] and lengths.tolist() == [2 * 288, 2 * 68]
    assert src.tolist() == [room.staging.base("kv"), room.staging.base("index") + 3 * 68]
    src, dst, lengths = batch_entries(room, pools, [("kv", 5, 7), ("index", 0, 7), ("tail", 0, 1)])
    assert lengths.tolist() == [2 * 288 + 7 * 68 + 4096] and src.tolist() == [room.staging.base("kv") + 5 * 288]


def test_staged_source_to_direct_destination_breaks_at_destination_runs_and_groups() -> None:
    room, pools = _staged_room(landing=None)
    assert not room.whole_extents
    src, dst, lengths = batch_entries(room, pools, [(g.name, 0, g.num_rows) for g in MANIFEST.groups])
    assert lengths.tolist() == [7 * 288, 7 * 68, 2 * 4096]  # contiguous on both sides within each group
    assert src.tolist() == [room.staging.base(g) for g in ("kv", "index", "tail")]
    assert dst.tolist() == [(1 << 40) + 3 * 288, (1 << 40) + (1 << 20) + 3 * 68, (1 << 40) + 3 * (1 << 20) + 3 * 4096]


def test_a_landing_handshake_must_not_list_slot_runs() -> None:
    room, _ = _staged_room(landing=None)
    req = TransferRequest(4, "tcp://d", "127.0.0.1:1", COMPAT, MANIFEST, room.request.destinations, 1 << 42)
    with pytest.raises(ValueError, match="a handshake with a landing extent must not list slot runs too "
                                         r"\(4 groups listed\)"):
        check_request(room, req)
    for address in (0, (1 << 64) - 100):
        req = TransferRequest(4, "tcp://d", "127.0.0.1:1", COMPAT, MANIFEST, (), address)
        with pytest.raises(ValueError, match=f"landing extent address {address:#x} cannot hold 10684 B"):
            check_request(room, req)


def test_landed_rows_and_destinations_of_a_staged_decode_room() -> None:
    landing = ExtentBuffer(LANDING_POOL, 64 << 10)
    room = DecodeRoom(4, "127.0.0.1:1", MANIFEST, {}, created_at=0.0, landing=landing.reserve(MANIFEST.total_bytes))
    assert destinations(room, {}) == () and room.owned_slots() == {LANDING_POOL: room.landing}
    landing.bytes_of(room.landing)[:MANIFEST.total_bytes] = np.arange(MANIFEST.total_bytes) % 251
    index = landed_rows(room, landing, "index")
    assert index.shape == (7, 68) and index[0, 0] == (7 * 288) % 251
    assert landed_rows(room, landing, "tails").shape == (0, 4096)
    assert crc32c(landed_rows(room, landing, "tail")) == crc32c(
        (np.arange(7 * 288 + 7 * 68, MANIFEST.total_bytes) % 251).astype(np.uint8))


def test_few_ranges_are_checked_without_numpy_the_same_way() -> None:
    regions = RegisteredRegions()
    regions.add(1000, 100)
    regions.add(5000, 50)
    regions.check([1000, 1090, 5000], [100, 10, 50])
    for ptrs, lengths in (([1050], [51]), ([999], [1]), ([1100], [1]), ([5000, 6000], [1, 1])):
        with pytest.raises(Exception, match="is not inside a registered memory region"):
            regions.check(np.array(ptrs, dtype=np.uint64), np.array(lengths, dtype=np.uint64))
