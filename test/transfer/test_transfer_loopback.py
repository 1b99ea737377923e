"""Real transfers between a spawned prefill agent and a decode agent over Mooncake (TCP, 127.0.0.1)."""

from __future__ import annotations

import math
import time

import pytest
from transfer_cases import SUCCESS, TERMINAL, WAITING, W, asym_groups


def count_runs(src: list[int], dst: list[int]) -> int:
    """Entries a coalescing writer needs: a new one wherever either side stops stepping by one."""
    return sum(1 for i in range(len(src)) if i == 0 or src[i] != src[i - 1] + 1 or dst[i] != dst[i - 1] + 1)


def expected_entries(chunks, src, dst) -> int:
    """Runs never span two send_rows calls (each call is one range), so entries are exact."""
    return sum(count_runs(src[g][s:e], dst[g][s:e]) for g, s, e in chunks)


def assert_batching(before: dict, after: dict, chunks, src, dst) -> None:
    """Entries and bytes are exact. Ranges queued while a write runs share the next batch call, so
    the number of calls lies between one per 1024 entries and one per (range, 1024 entries)."""
    entries = expected_entries(chunks, src, dst)
    most = sum(math.ceil(count_runs(src[g][s:e], dst[g][s:e]) / 1024) for g, s, e in chunks)
    assert after["entries"] - before["entries"] == entries
    assert math.ceil(entries / 1024) <= after["batches"] - before["batches"] <= most
    assert after["largest_batch"] <= 1024 and after["failed_batches"] == before["failed_batches"]


def test_manifest_shapes() -> None:
    assert asym_groups(1) == asym_groups(W) == []
    assert dict((n, r) for n, _, r in asym_groups(129)) == {
        "L2.kv": 0, "L2.index": 0, "L8.kv": 0, "L8.index": 0, "L14.kv": 0, "L14.index": 0,
        "L20.kv": 1, "L20.index": 1, "tails": 3}
    assert sum(b * r for _, b, r in asym_groups(4097)) == 890 * 3969 + 3 * 4096 - 3 * 178  # B odd: 3 half pairs
    assert sum(b * r for _, b, r in asym_groups(257)) == 3 * 64 * 356 + 129 * 356 + 3 * 4096


@pytest.mark.parametrize("order", ["sender_first", "receiver_first", "rows_before_handshake"])
@pytest.mark.parametrize("n_tokens", [1, 128, 129, 257, 4097])
def test_payload_moves_every_byte(pair, n_tokens: int, order: str) -> None:
    P, D, room, groups = pair.P, pair.D, pair.next_room(), asym_groups(n_tokens)
    before = P.call("stats")
    if order == "receiver_first":
        dst = D.call("start_receiver", room=room, groups=groups, bootstrap_port=pair.port, snapshot=True)
    src = P.call("start_sender", room=room, groups=groups, seed=n_tokens)
    chunks = P.call("send_pipelined", room=room, chunk_rows=500) if order == "rows_before_handshake" else None
    if order != "receiver_first":
        dst = D.call("start_receiver", room=room, groups=groups, bootstrap_port=pair.port, snapshot=True)
    if chunks is None:
        assert P.call("wait", room=room, states=[WAITING] + TERMINAL)[0] == WAITING
        chunks = P.call("send_pipelined", room=room, chunk_rows=500)

    assert D.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert P.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    check = D.call("verify", room=room, seed=n_tokens)
    assert check == {"mismatched_groups": [], "untouched_ok": True,
                     "bytes_checked": sum(b * r for _, b, r in groups)}
    after = P.call("stats")
    assert after["bytes"] - before["bytes"] == check["bytes_checked"]
    assert_batching(before, after, chunks, src, dst)
    if n_tokens <= W:
        assert chunks == [] and after["batches"] == before["batches"]  # handshake and completion only
    D.call("release", room=room)
    P.call("release", room=room)
    pair.assert_clean()


def test_scattered_rows_are_chunked_under_the_peer_queue_limit(pair) -> None:
    """Every source row apart from its neighbours: one entry per row, several batches of <= 1024."""
    P, D, room, groups = pair.P, pair.D, pair.next_room(), asym_groups(4097)
    before = P.call("stats")
    src = P.call("start_sender", room=room, groups=groups, seed=7, scatter=True)
    dst = D.call("start_receiver", room=room, groups=groups, bootstrap_port=pair.port)
    P.call("send_pipelined", room=room, chunk_rows=1 << 20)  # one send_rows per group
    assert D.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert P.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert D.call("verify", room=room, seed=7)["mismatched_groups"] == []
    chunks = [(n, 0, r) for n, _, r in groups]
    after = P.call("stats")
    assert expected_entries(chunks, src, dst) > 19_000  # 19_845 rows, almost all apart from their neighbours
    assert_batching(before, after, chunks, src, dst)
    assert after["batches"] - before["batches"] >= 19  # batches of <= 1024 entries
    D.call("release", room=room)
    P.call("release", room=room)
    pair.assert_clean()


def test_concurrent_rooms_and_largest_room_id(pair) -> None:
    P, D = pair.P, pair.D
    rooms = [pair.next_room() for _ in range(3)] + [(1 << 63) - 1]
    for i, room in enumerate(rooms):
        P.call("start_sender", room=room, groups=asym_groups(1000 + 333 * i), seed=i)
        D.call("start_receiver", room=room, groups=asym_groups(1000 + 333 * i), bootstrap_port=pair.port)
    for room in rooms:
        P.call("send_pipelined", room=room, chunk_rows=256)
    for i, room in enumerate(rooms):
        assert D.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
        assert P.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
        assert D.call("verify", room=room, seed=i)["mismatched_groups"] == []
        D.call("release", room=room)
        P.call("release", room=room)
    pair.assert_clean()


@pytest.mark.parametrize("rows_first", [True, False])
def test_transfer_phase_starts_when_p_holds_rows_and_destinations(pair, rows_first: bool) -> None:
    """The benchmark's transfer phase starts at the later of P's finish() and D's handshake reaching
    P, and ends at D's verified Success (one host: both agents stamp time.monotonic())."""
    P, D, room, groups = pair.P, pair.D, pair.next_room(), asym_groups(1000)
    P.call("start_sender", room=room, groups=groups, seed=3)
    if rows_first:
        P.call("send_pipelined", room=room, chunk_rows=1 << 20)
    before_handshake = time.monotonic()
    D.call("start_receiver", room=room, groups=groups, bootstrap_port=pair.port, return_slots=False)
    if not rows_first:
        assert P.call("wait", room=room, states=[WAITING] + TERMINAL)[0] == WAITING
        before_rows = time.monotonic()
        P.call("send_pipelined", room=room, chunk_rows=1 << 20)
    state, seconds, success_at = D.call("seconds_to_outcome", room=room)
    start = P.call("transfer_phase_start", room=room)
    assert state == SUCCESS and (before_handshake if rows_first else before_rows) < start < success_at
    if rows_first:  # the phase leaves out D's slot allocation and the handshake's way to P
        assert success_at - start < seconds
    assert P.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert D.call("verify", room=room, seed=3)["mismatched_groups"] == []
    D.call("release", room=room)
    P.call("release", room=room)
    pair.assert_clean()
