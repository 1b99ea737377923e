"""Staged transfers between real agents over Mooncake (TCP, 127.0.0.1): P copies a room's rows into
its staging extent, D offers one landing extent, the room goes out in a few entries. Every byte is
checked, nothing outside the room's extent changes, rooms that do not fit go direct, either side
may be staged alone, and the failure paths quarantine the landing extent as they do pool slots."""

from __future__ import annotations

import dataclasses
import time

import pytest
import transfer_cases
from transfer_cases import CONFIG, FAILED, SUCCESS, TERMINAL, WAITING, AgentPair, asym_groups

from sglang_asym.transfer.extents import LANDING_POOL

STAGED_BYTES = 4 << 20   # one 4097-token room (3.5 MB) fits, a second one at the same time does not
PIECE = 512 << 10        # staging.MIN_PIECE_BYTES
# A write to a frozen peer blocks for write_timeout_s: 3 s here, three times the peer timeout, so a
# service thread that waited for it would be taken for dead (the frozen-decode test below).
STAGED_CONFIG = dataclasses.replace(CONFIG, landing_bytes=STAGED_BYTES, staging_bytes=STAGED_BYTES,
                                    write_timeout_s=3)


def payload(groups) -> int:
    return sum(b * r for _, b, r in groups)


@pytest.fixture(scope="module")
def staged():
    agents = AgentPair(STAGED_CONFIG, first_room=1 << 45)
    yield agents
    agents.stop()


def run_room(P, D, port: int, room: int, groups, seed: int, order: str, chunk_rows: int = 500):
    if order == "receiver_first":
        D.call("start_receiver", room=room, groups=groups, bootstrap_port=port, snapshot=True)
    P.call("start_sender", room=room, groups=groups, seed=seed)
    chunks = P.call("send_pipelined", room=room, chunk_rows=chunk_rows) if order == "rows_before_handshake" else None
    if order != "receiver_first":
        D.call("start_receiver", room=room, groups=groups, bootstrap_port=port, snapshot=True)
    if chunks is None:
        assert P.call("wait", room=room, states=[WAITING] + TERMINAL)[0] == WAITING
        chunks = P.call("send_pipelined", room=room, chunk_rows=chunk_rows)
    assert D.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert P.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    return room, chunks


@pytest.mark.parametrize("order", ["sender_first", "receiver_first", "rows_before_handshake"])
@pytest.mark.parametrize("n_tokens", [1, 128, 129, 257, 4097])
def test_staged_payload_moves_every_byte(staged, n_tokens: int, order: str) -> None:
    P, D, groups = staged.P, staged.D, asym_groups(n_tokens)
    before = P.call("stats")
    room, chunks = run_room(P, D, staged.port, staged.next_room(), groups, n_tokens, order)
    check = D.call("verify", room=room, seed=n_tokens)
    assert check == {"mismatched_groups": [], "untouched_ok": True, "bytes_checked": payload(groups)}
    assert P.call("stats")["bytes"] - before["bytes"] == payload(groups)
    entries = P.call("entry_count", room=room)
    if n_tokens <= 128:
        assert entries == 0 and chunks == []
    else:
        assert P.call("staged", room=room) and D.call("staged", room=room)
        if order == "rows_before_handshake":  # one write of the whole extent, cut for the lanes
            assert entries == max(1, min(4, -(-payload(groups) // PIECE)))
        else:  # one entry per range handed over (neighbours in the extent merged), pieces for large ones
            assert 1 <= entries <= len(chunks) + 4
    D.call("release", room=room)
    P.call("release", room=room)
    staged.assert_clean()


def test_a_room_that_does_not_fit_goes_direct_and_both_arrive(staged) -> None:
    P, D, port, groups = staged.P, staged.D, staged.port, asym_groups(4097)
    first, second = staged.next_room(), staged.next_room()
    for room in (first, second):
        P.call("start_sender", room=room, groups=groups, seed=room % 7)
        D.call("start_receiver", room=room, groups=groups, bootstrap_port=port)
    assert (P.call("staged", room=first), D.call("staged", room=first)) == (True, True)
    assert (P.call("staged", room=second), D.call("staged", room=second)) == (False, False)
    for room in (first, second):
        P.call("send_pipelined", room=room, chunk_rows=700)
    for room in (first, second):
        assert D.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
        assert P.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
        assert D.call("verify", room=room, seed=room % 7)["mismatched_groups"] == []
        D.call("release", room=room)
        P.call("release", room=room)
    staged.assert_clean()


@pytest.mark.parametrize("staged_side", ["prefill", "decode"])
def test_one_staged_side_talks_to_a_direct_one(staged, pair, staged_side: str) -> None:
    """A staged P writes its staging extent into D's pool slots; a direct P its pool slots into D's
    landing extent. Entries then break where the direct side's rows do."""
    P, D, port = (staged.P, pair.D, staged.port) if staged_side == "prefill" else (pair.P, staged.D, pair.port)
    groups = asym_groups(2000)
    room, _ = run_room(P, D, port, staged.next_room(), groups, 11, "rows_before_handshake", chunk_rows=1 << 20)
    assert D.call("verify", room=room, seed=11) == {"mismatched_groups": [], "untouched_ok": True,
                                                    "bytes_checked": payload(groups)}
    assert P.call("staged", room=room) == (staged_side == "prefill")
    assert D.call("staged", room=room) == (staged_side == "decode")
    assert P.call("entry_count", room=room) > len(groups)  # the direct side's runs of 128 / 23 slots
    D.call("release", room=room)
    P.call("release", room=room)
    staged.assert_clean()
    pair.assert_clean()


# ---- failures: the landing extent is what a late write can reach -------------------------------
GROUPS = asym_groups(4097)


def bound_room(staged, seed: int) -> int:
    room = transfer_cases.bound_room(staged, GROUPS, seed)
    assert staged.D.call("staged", room=room) and staged.P.call("staged", room=room)
    return room


def landing_quarantined(staged) -> int:
    return staged.D.call("slots")[LANDING_POOL]["quarantined"]


def extent_blocks() -> int:
    return -(-payload(GROUPS) // 64)


def test_staged_checksum_mismatch_fails_both_sides_and_frees_the_extent(staged) -> None:
    room = bound_room(staged, 1)
    staged.P.call("send_pipelined", room=room, chunk_rows=1000, finish=False)
    deadline = time.monotonic() + 5
    while staged.P.call("rows_written", room=room) != {n: r for n, _, r in GROUPS} and time.monotonic() < deadline:
        time.sleep(0.01)
    staged.D.call("corrupt", room=room, group="L8.index", row=700)  # a stray write into the landing extent
    staged.P.call("finish", room=room)
    state, reason, _ = staged.D.call("wait", room=room, states=TERMINAL)
    assert state == FAILED and reason.startswith("checksum mismatch in group 'L8.index': destination rows crc32c=")
    assert staged.P.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, f"decode rejected the transfer: {reason}")
    assert staged.D.call("wait_slots_free", timeout_s=CONFIG.quarantine_grace_s / 2)["all_free"]
    staged.P.call("release", room=room)
    staged.assert_clean()


def test_staged_abort_from_decode_is_confirmed_and_frees_the_extent(staged) -> None:
    room = bound_room(staged, 2)
    staged.D.call("abort", room=room, reason="request cancelled")
    assert staged.D.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, "request cancelled")
    assert staged.P.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, "aborted by decode: request cancelled")
    assert staged.D.call("wait_slots_free", timeout_s=CONFIG.quarantine_grace_s / 2)["all_free"]
    staged.P.call("release", room=room)
    staged.assert_clean()


def test_staged_rejected_write_quarantines_the_extent_then_recovers(staged) -> None:
    room = bound_room(staged, 3)
    staged.D.call("unregister", group=LANDING_POOL)
    try:
        staged.P.call("send_rows", room=room, group="L20.kv", start=256, end=257)
        state, reason, _ = staged.P.call("wait", room=room, states=TERMINAL)
        assert state == FAILED and "returned -1" in reason
        assert reason.startswith("writing group 'L20.kv' rows [256, 257) to decode failed: Mooncake batch write")
        assert staged.D.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, f"prefill failed: {reason}")
        assert landing_quarantined(staged) == extent_blocks()  # a -1 may still deliver bytes late
        report = staged.D.call("slots")
        assert all(row["quarantined"] == 0 for name, row in report.items() if name != LANDING_POOL)
        state = staged.D.call("wait_slots_free", timeout_s=CONFIG.quarantine_grace_s + 2)
        assert state["all_free"], state["reports"]
    finally:
        staged.D.call("register", group=LANDING_POOL)
    staged.P.call("release", room=room)
    room, _ = run_room(staged.P, staged.D, staged.port, staged.next_room(), asym_groups(257), 5, "sender_first",
                       chunk_rows=64)
    assert staged.D.call("verify", room=room, seed=5)["mismatched_groups"] == []
    staged.D.call("release", room=room)
    staged.P.call("release", room=room)
    staged.assert_clean()


def test_staged_killed_prefill_holds_the_extent_for_the_grace_period(staged) -> None:
    room = bound_room(staged, 4)
    staged.P.kill()
    try:
        state, reason, _ = staged.D.call("wait", room=room, states=TERMINAL, timeout_s=CONFIG.peer_timeout_s + 3)
        assert state == FAILED and "silent for" in reason and "(dead or frozen)" in reason
        assert landing_quarantined(staged) == extent_blocks()
        state = staged.D.call("wait_slots_free", timeout_s=CONFIG.quarantine_grace_s + 2)
        assert state["all_free"], state["reports"]
    finally:
        staged.restart_prefill()
    room, _ = run_room(staged.P, staged.D, staged.port, staged.next_room(), asym_groups(300), 6, "receiver_first")
    assert staged.D.call("verify", room=room, seed=6)["mismatched_groups"] == []
    staged.D.call("release", room=room)
    staged.P.call("release", room=room)
    staged.assert_clean()


def test_a_decode_frozen_during_an_inline_write_does_not_silence_prefill(staged, pair) -> None:
    """P waits for a small finished room's write on its service thread, but only briefly: with the
    decode peer frozen mid-write, P keeps answering another decode worker's heartbeats (that room
    stays alive and then succeeds), and P fails the frozen room.

    Mooncake's TCP transport counts an entry done once the kernel has taken its bytes, so whether the
    write to the frozen D hangs is the kernel's choice: it hangs (and times out after
    write_timeout_s) when the lanes' socket buffers cannot hold the room, and finishes without D
    when they can. Both outcomes are checked exactly. A fresh D makes the hang the usual one: its
    lanes are new, their buffers not yet grown by earlier large rooms."""
    staged.restart_decode()
    warm = staged.next_room()  # so D knows P's endpoint: its handshake leaves from create_receiver itself
    run_room(staged.P, staged.D, staged.port, warm, asym_groups(130), 20, "sender_first")
    staged.D.call("release", room=warm)
    staged.P.call("release", room=warm)
    healthy, frozen = staged.next_room(), staged.next_room()
    small = asym_groups(600)
    staged.P.call("start_sender", room=healthy, groups=small, seed=21)
    pair.D.call("start_receiver", room=healthy, groups=small, bootstrap_port=staged.port)
    assert staged.P.call("wait", room=healthy, states=[WAITING] + TERMINAL)[0] == WAITING
    before = staged.P.call("stats")
    staged.P.call("start_sender", room=frozen, groups=GROUPS, seed=22)
    staged.P.call("send_pipelined", room=frozen, chunk_rows=1 << 20)  # finished before D asks: written inline
    # Freeze D between its handshake and P's 3.5 MB inline write (~3 ms): P is held still until the
    # handshake sits unread in its socket, then D is frozen and P resumed.
    control_port = int(staged.P.info["control_endpoint"].rsplit(":", 1)[1])
    staged.P.freeze()
    try:
        staged.D.call("start_receiver", room=frozen, groups=GROUPS, bootstrap_port=staged.port, return_slots=False)
        transfer_cases.wait_delivered(staged.D.pid, control_port)
        staged.D.freeze()
    finally:
        staged.P.thaw()  # frozen for milliseconds: the healthy room's D (peer timeout 1 s) does not notice
    try:
        # P gives the frozen room up (D silent for the peer timeout, or the write timed out) ...
        state, reason, _ = staged.P.call("wait", room=frozen, states=TERMINAL,
                                         timeout_s=STAGED_CONFIG.write_timeout_s + 3)
        assert state == FAILED and ("to decode failed: Mooncake batch write" in reason or
                                    "(dead or frozen)" in reason), reason
        # ... and the write ends: hung until write_timeout_s (one failed batch), or taken in whole by the kernel
        deadline = time.monotonic() + STAGED_CONFIG.write_timeout_s + 3
        while staged.P.call("stats")["batches"] == before["batches"] and time.monotonic() < deadline:
            time.sleep(0.05)
        after = staged.P.call("stats")
        hung = after["failed_batches"] == before["failed_batches"] + 1
        assert after["batches"] == before["batches"] + 1
        assert hung or (after["failed_batches"] == before["failed_batches"] and
                        after["bytes"] - before["bytes"] == payload(GROUPS)), (before, after)
        # All that time (3 s when the write hung) the healthy room's D (peer timeout 1 s) still heard P.
        assert pair.D.call("wait", room=healthy, states=TERMINAL, timeout_s=0.1)[0] == WAITING
    finally:
        staged.D.thaw()
    state, reason_d, _ = staged.D.call("wait", room=frozen, states=TERMINAL)
    if hung:  # D saw P's failure notice, or (thawed past its handshake bound before the accept came off
        # the socket) gave up on the handshake itself
        assert state == FAILED and reason_d in (f"prefill failed: {reason}", "prefill did not accept within 3s"), \
            reason_d
    elif state == SUCCESS:  # P's completion came off D's socket before its failure notice: every byte is there
        assert staged.D.call("verify", room=frozen, seed=22)["mismatched_groups"] == []
        staged.D.call("release", room=frozen)
    else:
        assert (state, reason_d) == (FAILED, f"prefill failed: {reason}")
    staged.P.call("send_pipelined", room=healthy, chunk_rows=200)
    assert pair.D.call("wait", room=healthy, states=TERMINAL)[:2] == (SUCCESS, "")
    assert pair.D.call("verify", room=healthy, seed=21)["mismatched_groups"] == []
    assert staged.P.call("wait", room=healthy, states=TERMINAL)[:2] == (SUCCESS, "")  # D's confirmation came
    pair.D.call("release", room=healthy)
    staged.P.call("release", room=healthy)
    staged.P.call("release", room=frozen)
    state = staged.D.call("wait_slots_free", timeout_s=CONFIG.quarantine_grace_s + 2)  # a -1 may land late
    assert state["all_free"], state["reports"]
    staged.assert_clean()
    pair.assert_clean()
