"""P's checks of D's handshake, the write address math, and D's completion check (no engine needed)."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from transfer_cases import COMPAT

from sglang_asym.manifest import PayloadManifest, RowGroup
from sglang_asym.transfer import RowPool
from sglang_asym.transfer.checksum import GroupChecksum, crc_rows
from sglang_asym.transfer.decode_room import DecodeRoom, verify_completion
from sglang_asym.transfer.messages import GroupDestination, TransferComplete, TransferRequest
from sglang_asym.transfer.prefill_room import (PrefillRoom, batch_entries, check_request, check_source_slots,
                                                write_entries)
from sglang_asym.transfer.runs import pack_runs

MANIFEST = PayloadManifest((RowGroup("L20.kv", 288, 5), RowGroup("tails", 4096, 0)))
POOLS = {"L20.kv": RowPool.zeros("L20.kv", 32, 288), "tails": RowPool.zeros("tails", 4, 4096)}


def request(**dest_overrides) -> TransferRequest:
    kv = GroupDestination.for_slots("L20.kv", 1 << 40, 16, 288, np.array([10, 11, 3, 4, 5]))
    kv = dataclasses.replace(kv, **dest_overrides)
    return TransferRequest(9, "tcp://d", "127.0.0.1:1", COMPAT, MANIFEST,
                           (kv, GroupDestination.for_slots("tails", 1 << 41, 4, 4096, np.zeros(0, dtype=np.int64))))


def room() -> PrefillRoom:
    slots = check_source_slots(MANIFEST, {"L20.kv": [4, 5, 6, 20, 21]}, POOLS)
    return PrefillRoom(9, MANIFEST, slots, created_at=0.0)


def test_source_slot_checks() -> None:
    with pytest.raises(ValueError, match="group 'L20.kv': 5 rows but 4 source slots"):
        check_source_slots(MANIFEST, {"L20.kv": [0, 1, 2, 3]}, POOLS)
    with pytest.raises(ValueError, match="slot out of range for pool 'L20.kv'"):
        check_source_slots(MANIFEST, {"L20.kv": [0, 1, 2, 3, 32]}, POOLS)
    with pytest.raises(ValueError, match=r"source_slots has groups not in the manifest: \['L2.kv'\]"):
        check_source_slots(MANIFEST, {"L20.kv": [0, 1, 2, 3, 4], "L2.kv": []}, POOLS)
    with pytest.raises(ValueError, match="manifest group 'L20.kv' has no source pool"):
        check_source_slots(MANIFEST, {"L20.kv": [0, 1, 2, 3, 4]}, {"tails": POOLS["tails"]})


def test_handshake_gives_destination_slots_in_row_order() -> None:
    dest = check_request(room(), request())
    assert dest["L20.kv"].tolist() == [10, 11, 3, 4, 5] and dest["tails"].tolist() == []


@pytest.mark.parametrize("overrides, message", [
    ({"runs": pack_runs([(10, 2), (3, 2)])}, "group 'L20.kv': decode offers 4 rows of 288 B, "
                                             "manifest needs 5 rows of 288 B"),
    ({"row_bytes": 292}, "decode offers 5 rows of 292 B"),
    ({"runs": pack_runs([(10, 2), (14, 3)])}, "group 'L20.kv': decode slot 16 outside its pool of 16 slots"),
    ({"runs": pack_runs([(10, 2), (14, -3)])}, r"group 'L20.kv': malformed destination runs: invalid slot run "
                                               r"\(start=14, length=-3\)"),
    ({"runs": b"123"}, "malformed destination runs: packed slot runs must be a multiple of 16 bytes, got 3"),
])
def test_bad_destinations_are_refused(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_request(room(), request(**overrides))


def test_manifest_and_group_order_must_match() -> None:
    other = dataclasses.replace(request(), manifest=PayloadManifest((RowGroup("L20.kv", 288, 6),)))
    with pytest.raises(ValueError, match="payload manifest differs: prefill has L20.kv:5x288B, tails:0x4096B, "
                                         "decode has L20.kv:6x288B"):
        check_request(room(), other)
    swapped = dataclasses.replace(request(), destinations=request().destinations[::-1])
    with pytest.raises(ValueError, match=r"decode destinations cover groups \['tails', 'L20.kv'\]"):
        check_request(room(), swapped)


def test_write_entries_coalesce_both_sides() -> None:
    r = room()
    r.request, r.dest_slots = request(), check_request(r, request())
    src, dst, lengths = write_entries(r, POOLS["L20.kv"], "L20.kv", 0, 5)
    base = POOLS["L20.kv"].base_ptr
    # rows: src 4,5,6,20,21 -> dst 10,11,3,4,5: runs (4->10 x2), (6->3 x1), (20->4 x2)
    assert src.tolist() == [base + 4 * 288, base + 6 * 288, base + 20 * 288]
    assert dst.tolist() == [(1 << 40) + 10 * 288, (1 << 40) + 3 * 288, (1 << 40) + 4 * 288]
    assert lengths.tolist() == [576, 288, 576]
    src, dst, lengths = write_entries(r, POOLS["L20.kv"], "L20.kv", 2, 4)
    assert (src.tolist(), lengths.tolist()) == ([base + 6 * 288, base + 20 * 288], [288, 288])
    assert np.asarray(dst).dtype == np.uint64


def test_batch_entries_equal_write_entries_and_never_span_two_ranges() -> None:
    """Two groups whose pools lie back to back on both sides: the last row of one group and the
    first row of the next are contiguous in memory, but must stay in separate entries."""
    manifest = PayloadManifest((RowGroup("a", 16, 3), RowGroup("b", 16, 4)))
    buffer = np.zeros(16 * 16, dtype=np.uint8)
    pools = {"a": RowPool("a", torch.from_numpy(buffer[:64]).view(4, 16)),
             "b": RowPool("b", torch.from_numpy(buffer[64:]).view(12, 16))}
    r = PrefillRoom(3, manifest, {"a": np.array([1, 2, 3]), "b": np.array([0, 1, 5, 6])}, created_at=0.0)
    r.request = TransferRequest(3, "tcp://d", "127.0.0.1:1", COMPAT, manifest, (
        GroupDestination.for_slots("a", 1 << 40, 4, 16, np.array([1, 2, 3])),
        GroupDestination.for_slots("b", (1 << 40) + 64, 12, 16, np.array([0, 1, 2, 3]))))
    r.dest_slots = check_request(r, r.request)
    ranges = [("a", 0, 2), ("a", 2, 3), ("b", 0, 4)]
    src, dst, lengths = batch_entries(r, pools, ranges)
    expected = [np.concatenate(parts) for parts in zip(*(write_entries(r, pools[g], g, s, e) for g, s, e in ranges))]
    assert [src.tolist(), dst.tolist(), lengths.tolist()] == [e.tolist() for e in expected]
    a, b = pools["a"].base_ptr, pools["b"].base_ptr
    assert src.tolist() == [a + 16, a + 48, b, b + 80] and lengths.tolist() == [32, 16, 32, 32]
    assert src.dtype == dst.dtype == lengths.dtype == np.uint64


def test_decode_never_accepts_partial_or_wrong_rows() -> None:
    pools = {"L20.kv": RowPool.zeros("L20.kv", 16, 288), "tails": RowPool.zeros("tails", 4, 4096)}
    pools["L20.kv"].array[:] = np.arange(16 * 288, dtype=np.uint64).reshape(16, 288) % 251
    room = DecodeRoom(9, "127.0.0.1:1", MANIFEST, {"L20.kv": np.array([10, 11, 3, 4, 5]),
                                                   "tails": np.zeros(0, dtype=np.int64)}, created_at=0.0)
    good = crc_rows(pools["L20.kv"], room.dest_slots["L20.kv"])
    with ThreadPoolExecutor(2) as ex:
        def verdict(rows: int, crc: int, order=("L20.kv", "tails")) -> str | None:
            sums = {"L20.kv": GroupChecksum("L20.kv", rows, crc), "tails": GroupChecksum("tails", 0, 0)}
            return verify_completion(room, TransferComplete(9, tuple(sums[g] for g in order)), pools, ex)

        assert verdict(5, good) is None
        assert verdict(4, good) == "partial transfer: group 'L20.kv' has 4 of 5 rows"
        assert verdict(5, good ^ 1).startswith("checksum mismatch in group 'L20.kv': destination rows crc32c=")
        assert verdict(5, good, ("tails", "L20.kv")) == (
            "completion covers groups ['tails', 'L20.kv'], manifest has ['L20.kv', 'tails']")


def _per_group_slots(req: TransferRequest) -> list[list[int]]:
    return [d.slots().tolist() for d in req.destinations]


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_handshake_check_and_entries_match_the_per_group_math(seed: int) -> None:
    """check_request's one-pass check over all groups and batch_entries' row table give the same
    slots and entries as the per-group reference (`GroupDestination.slots`, `write_entries`), for
    empty groups, scattered and contiguous slots, and ranges in any order."""
    rng = np.random.default_rng(seed)
    groups = [RowGroup(f"g{i}", int(rng.choice([16, 32])), int(rng.integers(0, 30)))
              for i in range(int(rng.integers(1, 5)))]
    manifest = PayloadManifest(tuple(groups))
    pools = {g.name: RowPool.zeros(g.name, 64, g.row_bytes) for g in groups}
    pick = lambda n, offset: rng.permutation(64)[:n] if rng.random() < 0.5 else np.arange(n) + offset  # noqa: E731
    src = {g.name: pick(g.num_rows, 3) for g in groups}
    dst = {g.name: pick(g.num_rows, 1) for g in groups}
    r = PrefillRoom(1, manifest, src, created_at=0.0)
    r.request = TransferRequest(1, "tcp://d", "127.0.0.1:1", COMPAT, manifest, tuple(
        GroupDestination.for_slots(g.name, (1 << 40) + i * 4096, 64, g.row_bytes, dst[g.name])
        for i, g in enumerate(groups)))
    r.dest_slots = check_request(r, r.request)
    assert list(r.dest_slots) == [g.name for g in groups]
    assert [s.tolist() for s in r.dest_slots.values()] == _per_group_slots(r.request)
    ranges = []
    for g in groups:
        a, b = sorted(rng.integers(0, g.num_rows + 1, size=2).tolist())
        ranges += [(g.name, 0, a), (g.name, a, b), (g.name, b, g.num_rows)]
    if rng.random() < 0.5:
        rng.shuffle(ranges)
    got = batch_entries(r, pools, ranges)
    parts = [write_entries(r, pools[g], g, s, e) for g, s, e in ranges if e > s]
    assert [a.tolist() for a in got] == [sum((p[i].tolist() for p in parts), []) for i in range(3)]


def test_vectorised_handshake_check_still_refuses_a_slot_past_the_pool() -> None:
    bad = dataclasses.replace(request(), destinations=(
        GroupDestination.for_slots("L20.kv", 1 << 40, 11, 288, np.array([10, 11, 3, 4, 5])),
        request().destinations[1]))
    with pytest.raises(ValueError, match="group 'L20.kv': decode slot 11 outside its pool of 11 slots"):
        check_request(room(), bad)
