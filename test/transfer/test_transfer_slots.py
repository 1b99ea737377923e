"""Destination slot ownership on D: allocator, quarantine, and the accounting that proves no leak."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_asym.manifest import PayloadManifest, RowGroup
from sglang_asym.transfer.errors import SlotsExhaustedError
from sglang_asym.transfer.slots import DecodeSlots, Quarantine, SlotAllocator


def test_fresh_allocations_are_ascending_then_follow_frees() -> None:
    alloc = SlotAllocator("kv", 10)
    a = alloc.allocate(4)
    b = alloc.allocate(3)
    assert a.tolist() == [0, 1, 2, 3] and b.tolist() == [4, 5, 6]
    alloc.free(np.array([1, 2]))
    alloc.free(np.array([5]))
    assert alloc.allocate(4).tolist() == [5, 1, 2, 7]  # non-contiguous: freed slots first
    assert (alloc.num_free, alloc.num_allocated) == (2, 8)
    alloc.check_consistent()


def test_exhaustion_and_bad_frees_change_nothing() -> None:
    alloc = SlotAllocator("kv", 4)
    taken = alloc.allocate(3)
    with pytest.raises(SlotsExhaustedError, match="pool 'kv': need 2 slots, 1 of 4 free"):
        alloc.allocate(2)
    with pytest.raises(ValueError, match="pool 'kv': double free or free of a slot never allocated"):
        alloc.free(np.array([3]))
    with pytest.raises(ValueError, match="double free"):
        alloc.free(np.array([0, 0]))
    with pytest.raises(ValueError, match=r"freeing slot out of range \[0, 4\)"):
        alloc.free(np.array([4]))
    assert alloc.num_free == 1
    alloc.free(taken)
    assert alloc.num_free == 4
    alloc.check_consistent()
    with pytest.raises(ValueError, match="capacity must be positive"):
        SlotAllocator("x", 0)


def test_quarantine_releases_on_confirmation_or_expiry() -> None:
    q = Quarantine()
    q.hold(1, {"kv": np.array([3, 4])}, release_at=10.0)
    q.hold(2, {"kv": np.array([5]), "idx": np.array([0])}, release_at=20.0)
    with pytest.raises(ValueError, match="bootstrap_room=1 already has rows in quarantine"):
        q.hold(1, {}, 0.0)
    assert q.rows_by_group() == {"kv": 3, "idx": 1} and len(q) == 2
    assert q.expire(9.9) == []
    assert [h.room for h in q.expire(10.0)] == [1]
    held = q.release(2)
    assert held.num_rows == 2 and q.release(2) is None and len(q) == 0


def make_slots() -> tuple[DecodeSlots, PayloadManifest]:
    slots = DecodeSlots({"kv": SlotAllocator("kv", 8), "idx": SlotAllocator("idx", 4)})
    return slots, PayloadManifest((RowGroup("kv", 288, 5), RowGroup("idx", 68, 3)))


def test_decode_slots_account_for_every_owner() -> None:
    slots, manifest = make_slots()
    active = slots.allocate(manifest)
    failed = slots.allocate(PayloadManifest((RowGroup("kv", 288, 2),)))
    slots.hold(9, failed, release_at=5.0)
    assert slots.report([active]) == {
        "kv": {"capacity": 8, "free": 1, "active": 5, "quarantined": 2, "handed_over": 0},
        "idx": {"capacity": 4, "free": 1, "active": 3, "quarantined": 0, "handed_over": 0}}
    slots.check_no_leaks([active])
    slots.hand_over(7, active)
    slots.check_no_leaks([])
    assert slots.expire(4.0) == 0 and slots.expire(5.0) == 1
    slots.take_back(7)
    slots.take_back(7)  # idempotent
    assert all(r["free"] == r["capacity"] for r in slots.report([]).values())


def test_a_leak_is_detected() -> None:
    slots, manifest = make_slots()
    slots.allocate(manifest)  # allocated, but nobody owns it
    with pytest.raises(AssertionError, match="pool 'kv' leaks: 5 allocated but 0 accounted for"):
        slots.check_no_leaks([])


def test_allocation_is_all_or_nothing() -> None:
    slots, _ = make_slots()
    with pytest.raises(SlotsExhaustedError, match="pool 'idx': need 5 slots, 4 of 4 free"):
        slots.allocate(PayloadManifest((RowGroup("kv", 288, 2), RowGroup("idx", 68, 5))))
    with pytest.raises(ValueError, match="manifest group 'tails' has no destination pool"):
        slots.allocate(PayloadManifest((RowGroup("kv", 288, 2), RowGroup("tails", 4096, 1))))
    assert [r["free"] for r in slots.report([]).values()] == [8, 4]
