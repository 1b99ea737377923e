"""room_lifecycle.py's answers to D's handshake on P, on a recording stand-in for SGLang's manager: a handshake
that comes after P aborted the room, before or after P's scheduler cleared the aborted sender, is answered
with Failed at once (words that say the abort); one for a live room is SGLang's. And which servers get the
mixins: asym-prefill's exact-payload classes and SGLang's own prefill mode on Mooncake."""

from __future__ import annotations

import json
import time
import types

from sglang.srt.disaggregation.base.conn import KVPoll

from sglang_asym.sglang_plugin.shared.relayed_refusal import relay_reason, relayed_refusal
from sglang_asym.sglang_plugin.shared.room_lifecycle import PREFILL_ABORT_WORDS, RoomLifecycleManager, RoomLifecycleSender

from .conftest import REPO, run_python

ROOM = 41
D = ("127.0.0.1", 9000)


class RecordingManager:
    """Just the tables and calls of SGLang's CommonKVManager that the mixin uses."""

    def __init__(self) -> None:
        self.transfer_infos: dict = {}
        self.req_to_decode_prefix_len: dict = {}
        self.statuses: list = []
        self.sent: list = []

    def update_status(self, room, status):
        self.statuses.append((room, status))

    def send_kv_status_message(self, targets, bootstrap_room, status, failure_reason=None):
        self.sent.append((targets, bootstrap_room, status, failure_reason))


class Manager(RoomLifecycleManager, RecordingManager):
    pass


def handshake(manager: Manager) -> None:
    """What SGLang's bootstrap thread does with D's handshake: the room's table, then WaitingForInput."""
    manager.transfer_infos[ROOM] = {"s": types.SimpleNamespace(endpoint=D[0], dst_port=D[1], is_dummy=False)}
    manager.update_status(ROOM, KVPoll.WaitingForInput)


def test_a_handshake_after_an_abort_on_p_before_its_sender_is_cleared_is_answered_failed():
    manager = Manager()
    manager._live_senders[ROOM] = types.SimpleNamespace(_rows_queued=False)
    manager.note_aborted(ROOM)
    handshake(manager)
    assert manager.statuses == [] and ROOM not in manager.transfer_infos
    [(targets, room, status, reason)] = manager.sent
    assert (targets, room, status) == ([D], ROOM, KVPoll.Failed) and PREFILL_ABORT_WORDS in reason


def test_a_handshake_for_a_live_room_or_one_with_rows_queued_is_sglangs():
    manager = Manager()
    manager._live_senders[ROOM] = types.SimpleNamespace(_rows_queued=False)
    handshake(manager)  # not aborted
    manager.note_aborted(ROOM + 1)
    manager._live_senders[ROOM + 1] = types.SimpleNamespace(_rows_queued=True)
    manager.transfer_infos[ROOM + 1] = {}
    manager.update_status(ROOM + 1, KVPoll.WaitingForInput)  # rows may be in flight: SGLang's path
    assert manager.sent == []
    assert manager.statuses == [(ROOM, KVPoll.WaitingForInput), (ROOM + 1, KVPoll.WaitingForInput)]


def test_a_handshake_after_the_aborted_sender_was_cleared_is_answered_failed():
    manager = Manager()
    manager.note_aborted(ROOM)
    manager.abandon_room(ROOM)  # the sender's clear found no handshake
    handshake(manager)
    assert manager.statuses == [] and [s[2] for s in manager.sent] == [KVPoll.Failed]


class RecordingSender:
    """Just what the sender mixin calls on SGLang's CommonKVSender: abort() marks the room Failed."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room) -> None:
        self.kv_mgr, self.bootstrap_room = mgr, bootstrap_room
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True

    def send(self, *args) -> None:
        pass

    def clear(self) -> None:
        pass


class Sender(RoomLifecycleSender, RecordingSender):
    pass


def _aborting_manager(outstanding: int) -> Manager:
    manager = Manager()
    manager.request_status = {}
    manager._staging_outstanding = {ROOM: outstanding}
    manager._room_notify_targets = lambda room: [D] if room == ROOM else []
    return manager


def _sent_within(manager: Manager, seconds: float) -> list:
    until = time.monotonic() + seconds
    while not manager.sent and time.monotonic() < until:
        time.sleep(0.01)
    return manager.sent


def test_an_abort_on_p_before_any_row_is_queued_tells_d_at_once():
    manager = _aborting_manager(outstanding=0)
    sender = Sender(manager, "p:1", ROOM)
    sender.abort()
    [(targets, room, status, reason)] = manager.sent
    assert sender.aborted and (targets, room, status) == ([D], ROOM, KVPoll.Failed) and PREFILL_ABORT_WORDS in reason


def test_an_abort_on_p_with_rows_queued_tells_d_once_the_writes_in_flight_drained():
    manager = _aborting_manager(outstanding=1)  # one chunk dequeued, its write not returned
    sender = Sender(manager, "p:1", ROOM)
    sender.send([0, 1])
    sender.abort()
    assert _sent_within(manager, 0.3) == []  # D must not free pages a write still lands in
    manager._staging_outstanding[ROOM] = 0
    [(targets, room, status, reason)] = _sent_within(manager, 5.0)
    assert (targets, room, status) == ([D], ROOM, KVPoll.Failed) and PREFILL_ABORT_WORDS in reason


OUT_OF_MEMORY = relay_reason(ROOM, 503, "the prefill worker ran out of memory")


def test_an_abort_with_ps_reason_tells_d_that_reason_whole():
    """out_of_memory.py notes the room aborted with its relay reason before SGLang's retire step aborts the
    sender: D's Failed frame carries P's status and words, and nothing else."""
    manager = _aborting_manager(outstanding=0)
    sender = Sender(manager, "p:1", ROOM)
    manager.note_aborted(ROOM, OUT_OF_MEMORY)
    sender.abort()  # notes the room aborted again, without a reason: the reason stays
    assert manager.sent == [([D], ROOM, KVPoll.Failed, OUT_OF_MEMORY)]
    assert relayed_refusal(OUT_OF_MEMORY)[0] == 503


def test_an_aborted_rooms_reason_answers_a_late_handshake_and_ends_with_the_next_request():
    manager = _aborting_manager(outstanding=0)
    manager._room_notify_targets = lambda room: []  # D has not handshaken yet
    sender = Sender(manager, "p:1", ROOM)
    manager.note_aborted(ROOM, OUT_OF_MEMORY)
    sender.abort()
    sender.conclude_state = KVPoll.Failed
    sender.clear()  # SGLang's scheduler clears the sender before D's handshake came
    handshake(manager)
    assert manager.sent == [([D], ROOM, KVPoll.Failed, OUT_OF_MEMORY)] and manager.statuses == []
    Sender(manager, "p:1", ROOM)  # the room's next request (a retry) starts with no reason of the old one
    assert ROOM not in manager._abort_reasons and ROOM not in manager._aborted_rooms


def test_sglangs_own_prefill_mode_gets_the_room_lifecycle_on_mooncake_and_nothing_else():
    """SGLang's own prefill servers on Mooncake have the rebootstrap race too (its D rebootstraps a retracted
    V4 request through P in the same room): with the plugin loaded, their scheduler's publish applies the
    get_kv_class hook alone, which hands out SGLang's Mooncake manager and sender with the mixins; the
    receiver, the fake backend and SGLang's decode and colocated modes keep SGLang's classes."""
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "stock_prefill_rooms"], timeout=400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    report = json.loads(lines[0].removeprefix("REPORT "))
    kv_class = "sglang.srt.disaggregation.utils.get_kv_class"
    assert kv_class not in report["decode"]["patched"]  # the CPU route's patches may share other targets
    assert report["prefill"]["patched"] == sorted([*report["decode"]["patched"], kv_class])
    sglangs = {"MOONCAKE MANAGER": ["MooncakeKVManager", "StagingManagerMixin", False],
               "MOONCAKE SENDER": ["MooncakeKVSender", "CommonKVSender", False],
               "MOONCAKE RECEIVER": ["MooncakeKVReceiver", "CommonKVReceiver", False],
               "FAKE MANAGER": ["FakeKVManager", "BaseKVManager", False],
               "FAKE SENDER": ["FakeKVSender", "BaseKVSender", False],
               "FAKE RECEIVER": ["FakeKVReceiver", "BaseKVReceiver", False]}
    assert report["decode"]["classes"] == sglangs
    assert report["null"]["classes"] == sglangs  # the hook applied, another mode: SGLang's classes
    assert report["prefill"]["classes"] == {
        **sglangs, "MOONCAKE MANAGER": ["RoomLifecycleKVManager", "RoomLifecycleManager", True],
        "MOONCAKE SENDER": ["RoomLifecycleKVSender", "RoomLifecycleSender", True]}
