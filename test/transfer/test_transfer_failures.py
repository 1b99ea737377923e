"""Failure injection on real agent processes: every failure must end Failed on BOTH sides,
within a bounded time, with a clear reason, and leave no slot leaked. Destination rows that
a late write could still reach stay quarantined until P confirms or the grace period ends."""

from __future__ import annotations

import time

import msgpack
import pytest
import zmq
import transfer_cases
from transfer_cases import CONFIG, FAILED, SUCCESS, TERMINAL, WAITING, asym_groups, free_port

from support.loopback_rpc import AgentError

N = 4097
GROUPS = asym_groups(N)
ROOM_ROWS = {n: r for n, _, r in GROUPS}
DETECT_S = CONFIG.peer_timeout_s + 1.5      # silence detection bound (timeout + ticks + slack)
CONFIRMED_FREE_S = CONFIG.quarantine_grace_s / 2  # freed this fast only if P confirmed it stopped


def bound_room(pair, seed: int) -> int:
    return transfer_cases.bound_room(pair, GROUPS, seed)


def quarantined(pair) -> dict[str, int]:
    return {n: row["quarantined"] for n, row in pair.D.call("slots").items() if row["quarantined"]}


def settle(pair, room: int, *, released_by_confirmation: bool) -> None:
    """Slots come back early only when P confirmed; otherwise only after the grace period."""
    if released_by_confirmation:
        state = pair.D.call("wait_slots_free", timeout_s=CONFIRMED_FREE_S)
        assert state["all_free"], state["reports"]
    else:
        assert quarantined(pair) == {n: r for n, r in ROOM_ROWS.items() if r}
        state = pair.D.call("wait_slots_free", timeout_s=CONFIG.quarantine_grace_s + 2)
        assert state["all_free"], state["reports"]
    pair.P.call("release", room=room)
    pair.assert_clean()


def test_abort_from_prefill(pair) -> None:
    room = bound_room(pair, 1)
    pair.P.call("abort", room=room, reason="client disconnected")
    assert pair.P.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, "client disconnected")
    assert pair.D.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, "prefill failed: client disconnected")
    settle(pair, room, released_by_confirmation=True)


def test_abort_from_decode(pair) -> None:
    room = bound_room(pair, 2)
    pair.D.call("abort", room=room, reason="request cancelled")
    assert pair.D.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, "request cancelled")
    assert pair.P.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, "aborted by decode: request cancelled")
    settle(pair, room, released_by_confirmation=True)


def test_checksum_mismatch_fails_both_sides(pair) -> None:
    room = bound_room(pair, 3)
    pair.P.call("send_pipelined", room=room, chunk_rows=1000, finish=False)
    deadline = time.monotonic() + 5
    while pair.P.call("rows_written", room=room) != ROOM_ROWS and time.monotonic() < deadline:
        time.sleep(0.01)
    pair.D.call("corrupt", room=room, group="L8.index", row=700)  # a stray write on D
    pair.P.call("finish", room=room)
    state, reason, _ = pair.D.call("wait", room=room, states=TERMINAL)
    assert state == FAILED and reason.startswith("checksum mismatch in group 'L8.index': destination rows crc32c=")
    assert pair.P.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, f"decode rejected the transfer: {reason}")
    settle(pair, room, released_by_confirmation=True)  # P wrote nothing after its completion


def test_rejected_write_quarantines_rows_then_recovers(pair) -> None:
    room = bound_room(pair, 4)
    pair.D.call("unregister", group="L20.kv")
    try:
        # One row = one entry. (A rejected batch of many entries can leave Mooncake 0.3.13's
        # TCP lanes to that peer failing for seconds or for good: see the report.)
        pair.P.call("send_rows", room=room, group="L20.kv", start=256, end=257)
        state, reason, _ = pair.P.call("wait", room=room, states=TERMINAL)
        assert state == FAILED
        assert reason.startswith("writing group 'L20.kv' rows [256, 257) to decode failed: Mooncake batch write")
        assert "returned -1" in reason
        assert pair.D.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, f"prefill failed: {reason}")
        settle(pair, room, released_by_confirmation=False)  # a -1 may still deliver bytes late
    finally:
        pair.D.call("register", group="L20.kv")
    # The next request to the same peer is not poisoned.
    room = pair.next_room()
    pair.P.call("start_sender", room=room, groups=asym_groups(257), seed=5)
    pair.D.call("start_receiver", room=room, groups=asym_groups(257), bootstrap_port=pair.port)
    pair.P.call("send_pipelined", room=room, chunk_rows=64)
    assert pair.D.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert pair.P.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert pair.D.call("verify", room=room, seed=5)["mismatched_groups"] == []
    pair.D.call("release", room=room)
    pair.P.call("release", room=room)
    pair.assert_clean()


def test_unregistered_source_is_refused_before_any_byte_moves(pair) -> None:
    before = pair.P.call("stats")
    refusal = pair.P.call("write_from_unregistered", session=pair.D.info["session"], dst_ptr=4096)
    assert "is not inside a registered memory region (9 registered)" in refusal
    assert pair.P.call("stats")["batches"] == before["batches"]


def test_malformed_control_messages_are_dropped(pair) -> None:
    before = pair.P.call("stats")["malformed_messages"]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(pair.P.info["control_endpoint"])
    sock.send(b"garbage")
    sock.send(msgpack.packb(["sgla", 99, "ping", {"decode_endpoint": "tcp://127.0.0.1:1"}]))
    sock.close()
    ctx.term()
    deadline = time.monotonic() + 5
    while pair.P.call("stats")["malformed_messages"] != before + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pair.P.call("stats")["malformed_messages"] == before + 2
    pair.assert_clean()


def test_one_engine_per_process(pair) -> None:
    assert pair.P.call("second_engine") == "a Mooncake engine already exists in this process (use one per process)"


def test_frozen_prefill(pair) -> None:
    room = bound_room(pair, 6)
    pair.P.freeze()
    try:
        state, reason, waited = pair.D.call("wait", room=room, states=TERMINAL)
        assert state == FAILED and waited < DETECT_S
        assert reason.startswith("prefill peer tcp://127.0.0.1:") and "(dead or frozen)" in reason
        assert quarantined(pair) == {n: r for n, r in ROOM_ROWS.items() if r}  # P could still write
    finally:
        pair.P.thaw()
    assert pair.P.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, f"aborted by decode: {reason}")
    settle(pair, room, released_by_confirmation=True)


def test_frozen_decode(pair) -> None:
    room = bound_room(pair, 7)
    failed_batches = pair.P.call("stats")["failed_batches"]
    pair.D.freeze()
    try:
        pair.P.call("send_rows", room=room, group="L20.kv", start=256, end=3969)
        state, reason, waited = pair.P.call("wait", room=room, states=TERMINAL)
        assert state == FAILED and waited < DETECT_S
        assert ("to decode failed: Mooncake batch write" in reason or
                (reason.startswith("decode peer tcp://127.0.0.1:") and "(dead or frozen)" in reason)), reason
        # Stay frozen until the blocked write timed out (-1): its bytes will land after the thaw.
        deadline = time.monotonic() + CONFIG.write_timeout_s + 3
        while pair.P.call("stats")["failed_batches"] == failed_batches and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pair.P.call("stats")["failed_batches"] == failed_batches + 1
    finally:
        pair.D.thaw()
    state, reason_d, _ = pair.D.call("wait", room=room, states=TERMINAL)
    assert state == FAILED and reason_d == f"prefill failed: {reason}"
    settle(pair, room, released_by_confirmation=False)


def test_killed_prefill(pair) -> None:
    room = bound_room(pair, 8)
    pair.P.kill()
    try:
        state, reason, waited = pair.D.call("wait", room=room, states=TERMINAL)
        assert state == FAILED and waited < DETECT_S and "(dead or frozen)" in reason
        assert quarantined(pair) == {n: r for n, r in ROOM_ROWS.items() if r}
        state = pair.D.call("wait_slots_free", timeout_s=CONFIG.quarantine_grace_s + 2)
        assert state["all_free"], state["reports"]
    finally:
        pair.restart_prefill()
    pair.assert_clean()


def test_killed_decode(pair) -> None:
    room = bound_room(pair, 9)
    pair.D.kill()
    try:
        pair.P.call("send_rows", room=room, group="L20.kv", start=256, end=3969)
        state, reason, waited = pair.P.call("wait", room=room, states=TERMINAL)
        assert state == FAILED and waited < DETECT_S
        assert "to decode failed: Mooncake batch write" in reason or "(dead or frozen)" in reason, reason
        pair.P.call("release", room=room)
    finally:
        pair.restart_decode()
    pair.assert_clean()


def test_handshake_timeouts(pair) -> None:
    lonely_receiver, lonely_sender = pair.next_room(), pair.next_room()
    pair.D.call("start_receiver", room=lonely_receiver, groups=GROUPS, bootstrap_port=pair.port)
    pair.P.call("start_sender", room=lonely_sender, groups=GROUPS, seed=10)
    state, reason, waited = pair.D.call("wait", room=lonely_receiver, states=TERMINAL)
    assert state == FAILED and waited < CONFIG.bootstrap_timeout_s + 1
    assert reason in (f"prefill did not accept within {CONFIG.bootstrap_timeout_s:g}s",
                      f"prefill refused the transfer: prefill has no request with "
                      f"bootstrap_room={lonely_receiver} after {CONFIG.bootstrap_timeout_s:g}s")
    state, reason_p, _ = pair.P.call("wait", room=lonely_sender, states=TERMINAL)
    assert (state, reason_p) == (FAILED, f"no decode handshake within {CONFIG.bootstrap_timeout_s:g}s")
    # A prefill request that shows up after D gave up must never bind D's old handshake.
    pair.P.call("start_sender", room=lonely_receiver, groups=GROUPS, seed=10)
    state, late, _ = pair.P.call("wait", room=lonely_receiver, states=TERMINAL, timeout_s=0.5)
    assert state == FAILED
    assert late in (f"aborted by decode: {reason}", f"decode handshake expired: {reason.split(': ', 1)[-1]}")
    for room in (lonely_sender, lonely_receiver):
        pair.P.call("release", room=room)
    pair.assert_clean(timeout_s=CONFIRMED_FREE_S)  # P confirmed it never wrote to the lonely room


def test_unreachable_bootstrap_server(pair) -> None:
    room, port = pair.next_room(), free_port()
    pair.D.call("start_receiver", room=room, groups=GROUPS, bootstrap_port=port)
    state, reason, waited = pair.D.call("wait", room=room, states=TERMINAL)
    assert state == FAILED and waited < 2
    assert reason.startswith(f"cannot bootstrap with prefill at 127.0.0.1:{port}: "
                             f"bootstrap server http://127.0.0.1:{port}/route?")
    assert "unreachable" in reason
    pair.assert_clean(timeout_s=0.5)  # no handshake was sent: freed at once


def test_incompatible_decode_is_refused_on_both_sides(pair) -> None:
    room = pair.next_room()
    pair.P.call("start_sender", room=room, groups=GROUPS, seed=11)
    pair.D.call("start_receiver", room=room, groups=GROUPS, bootstrap_port=pair.port, manager="other")
    diff = ("model_config_hash: 'sha256:test-model' != 'sha256:other-model'; "
            "semantics: 'asym' != 'decoder-replay'")
    expected = f"incompatible decode worker (prefill vs decode): {diff}"
    assert pair.P.call("wait", room=room, states=TERMINAL)[:2] == (FAILED, expected)
    assert pair.D.call("wait", room=room, states=TERMINAL, manager="other")[:2] == (
        FAILED, f"prefill refused the transfer: {expected}")
    pair.P.call("release", room=room)
    pair.assert_clean(timeout_s=0.5)


def test_manifest_disagreement_is_refused(pair) -> None:
    room = pair.next_room()
    pair.P.call("start_sender", room=room, groups=asym_groups(257), seed=12)
    pair.D.call("start_receiver", room=room, groups=asym_groups(259), bootstrap_port=pair.port)
    state, reason, _ = pair.P.call("wait", room=room, states=TERMINAL)
    assert state == FAILED and reason.startswith("refused decode handshake: payload manifest differs: "
                                                 "prefill has L2.kv:64x288B")
    state, reason_d, _ = pair.D.call("wait", room=room, states=TERMINAL)
    assert state == FAILED and reason_d.startswith("prefill refused the transfer: payload manifest differs")
    pair.P.call("release", room=room)
    pair.assert_clean(timeout_s=0.5)


def test_duplicate_rooms(pair) -> None:
    room = pair.next_room()
    pair.P.call("start_sender", room=room, groups=GROUPS, seed=13)
    with pytest.raises(AgentError,
                       match=f"DuplicateRoomError: bootstrap_room={room} is already active on this prefill"):
        pair.P.call("start_sender", room=room, groups=GROUPS, seed=13)
    pair.D.call("start_receiver", room=room, groups=GROUPS, bootstrap_port=pair.port)
    with pytest.raises(AgentError, match=f"DuplicateRoomError: bootstrap_room={room} is already active on this decode"):
        pair.D.call("start_receiver", room=room, groups=GROUPS, bootstrap_port=pair.port)
    assert pair.D.call("wait", room=room, states=[WAITING] + TERMINAL)[0] == WAITING
    # A second decode worker claiming the same room is refused; the first is unaffected.
    pair.D.call("start_receiver", room=room, groups=GROUPS, bootstrap_port=pair.port, manager="same")
    state, reason, _ = pair.D.call("wait", room=room, states=TERMINAL, manager="same")
    assert state == FAILED and reason.startswith(
        f"prefill refused the transfer: duplicate bootstrap_room={room}: already bound to decode tcp://127.0.0.1:")
    pair.P.call("send_pipelined", room=room, chunk_rows=2048)
    assert pair.D.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert pair.P.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert pair.D.call("verify", room=room, seed=13)["mismatched_groups"] == []
    pair.D.call("release", room=room)
    pair.P.call("release", room=room)
    pair.assert_clean()


@pytest.mark.parametrize("room", [-1, 1 << 63, True])
def test_room_ids_outside_the_sglang_range_are_refused(pair, room) -> None:
    with pytest.raises(AgentError, match=r"ValueError: bootstrap_room must be an int in \[0, 2\^63\)"):
        pair.P.call("start_sender", room=room, groups=GROUPS, seed=0)
    with pytest.raises(AgentError, match=r"ValueError: bootstrap_room must be an int in \[0, 2\^63\)"):
        pair.D.call("start_receiver", room=room, groups=GROUPS, bootstrap_port=pair.port)
    pair.assert_clean(timeout_s=0.5)
