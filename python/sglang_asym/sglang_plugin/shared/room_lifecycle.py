"""One bootstrap room, two lifecycles on P: SGLang's rebootstrap of a request D retracted.

A V4 pool keeps no host copy, so D rebootstraps a retracted request through P with the SAME room. P's
first lifecycle of that room ends in two steps: the transfer worker concludes Success (and tells D at
once), and later, when P's scheduler next polls the request, the sender's `clear()` pops the room's
tables (`request_status`, `transfer_infos`, `req_to_decode_prefix_len`). If P's scheduler is busy in a
long forward meanwhile, D can commit, decode, retract and send its new handshake for the room first:
the handshake lands in `transfer_infos`, its WaitingForInput is swallowed by the room's Success
(`update_status` keeps the larger), and the late `clear()` then erases it. P's new request for the room
waits for a handshake that never comes (SGLang's 300 s timeout, then a 500). Seen with a 20-token prompt
retracted while P computed a 3000-token one.

The two mixins below (on the exact-payload manager and its sender, prefill/exact_payload.py) keep the second
lifecycle's handshake:
  manager  conclude_transfer  remembers which handshake the concluded lifecycle had
  sender   clear              pops only the concluded lifecycle: a handshake that is not the remembered
                              one is put back afterwards, with its prefix length and WaitingForInput
  sender   __init__           a new sender for a room whose previous sender concluded but was not
                              cleared yet clears that one first (else the new one would read Success);
                              `clear()` runs once per sender

The same seam answers a handshake that comes after P gave the room up. P fails a room whose handshake
does not come within SGLang's bootstrap timeout (a frozen or overloaded D), or that is aborted first. A
D that resumes then still handshakes for it: SGLang's bootstrap thread records the handshake for a room
no sender owns any more (kept forever), and D waits out its whole waiting timeout (300 s by default)
before the client hears anything. P now tells that D at once that the room failed:
  sender   clear              a room that failed with no handshake from D is remembered (ABANDONED_KEEP_S)
  manager  update_status      D's handshake for such a room (its WaitingForInput) is answered with Failed
                              and dropped instead
  sender   abort              a request aborted on P alone: D, which handshook already, is told Failed
                              (SGLang tells D nothing, and D holds the room's slots for its whole waiting
                              timeout): at once when P queued none of its rows, else once the room's
                              writes in flight drained (D must not free pages a write still lands in)
  manager  update_status      D's handshake that comes after such an abort, before P's scheduler clears
                              the aborted sender (whose clear would drop it), is answered with Failed
  manager  send_kv_status_message
                              a Failed status for a room aborted on P carries PREFILL_ABORT_WORDS, which
                              D's recompute fallback (decode/transfer_fallback.py) reads as "do not recompute",
                              or, where P gave the abort a reason (prefill/out_of_memory.py), that reason

SGLang's own prefill mode has the same race (its D rebootstraps a retracted V4 request too): on Mooncake its
servers run SGLang's manager and sender with these mixins (`stock_mooncake_classes`, via exact_payload.py's hook).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

_UNKNOWN = object()
PREFILL_ABORT_WORDS = "aborted on the prefill worker"  # D's recompute fallback leaves such a room alone
DRAIN_WAIT_S, DRAIN_POLL_S = 30.0, 0.01  # an aborted room's in-flight writes: how long to wait, how often to look
STOCK_ROOMS_NOTE = "a rebootstrapped room keeps D's second handshake"  # logged once by SGLang's own prefill mode
ABANDONED_KEEP_S = 900.0  # how long P answers a late handshake for a room it gave up (beyond SGLang's timeouts)


def _remember(rooms: dict[int, float], reasons: dict[int, str], room: int, reason: str | None) -> None:
    """Records `room` (and `reason`, when given) as of now, first forgetting the rooms older than ABANDONED_KEEP_S."""
    now = time.monotonic()
    for old in [r for r, at in rooms.items() if now - at > ABANDONED_KEEP_S]:
        rooms.pop(old, None)
        reasons.pop(old, None)
    rooms[room] = now
    if reason:
        reasons[room] = reason


class RoomLifecycleManager:
    """Mixin for a CommonKVManager subclass (P side)."""

    # SGLang's Mooncake status frames carry no failure reason (D then says "it might be dead"); its decode
    # side reads a fourth frame when there is one, so D hears why P failed a room.
    kv_status_msg_carries_reason = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._live_senders: dict[int, Any] = {}  # room -> its sender not cleared yet (scheduler thread)
        self._concluded_handshakes: dict[int, Any] = {}  # room -> the handshake table its Success ended with
        self._abandoned_rooms: dict[int, float] = {}  # room -> when P failed it without D's handshake
        self._aborted_rooms: dict[int, float] = {}  # room -> when its request was aborted on P
        self._abandon_reasons: dict[int, str] = {}  # room -> why P gave it up, when P said (prefill/refusal.py)
        self._abort_reasons: dict[int, str] = {}  # room -> why its request was aborted, when P said (out_of_memory.py)
        super().__init__(*args, **kwargs)

    def note_aborted(self, room: int, reason: str | None = None) -> None:
        """The room's request is aborted on P; `reason` (kept until the room's next request) replaces the
        Failed frame's default words."""
        _remember(self._aborted_rooms, self._abort_reasons, room, reason)

    def send_kv_status_message(self, targets: Any, bootstrap_room: int, status: Any, failure_reason: Any = None) -> Any:
        """A room whose request was aborted on P fails on D in words that say so (SGLang's several paths
        send it with no reason or another one), so that D's recompute fallback leaves it alone."""
        from sglang.srt.disaggregation.base.conn import KVPoll

        if (status == KVPoll.Failed and bootstrap_room in self._aborted_rooms
                and PREFILL_ABORT_WORDS not in (failure_reason or "")):
            said = f"sglang-asym: request of room {bootstrap_room} {PREFILL_ABORT_WORDS}"
            failure_reason = (self._abort_reasons.get(bootstrap_room)  # P's own words, whole (relay_reason)
                              or (f"{said} ({failure_reason})" if failure_reason else said))
        return super().send_kv_status_message(targets=targets, bootstrap_room=bootstrap_room, status=status,
                                              failure_reason=failure_reason)

    def update_status(self, bootstrap_room: int, status: Any) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if (status == KVPoll.WaitingForInput and bootstrap_room in self._abandoned_rooms
                and bootstrap_room not in self._live_senders):
            self._refuse_late_handshake(bootstrap_room)
            return
        if status == KVPoll.WaitingForInput and self._aborted_before_handshake(bootstrap_room):
            self._refuse_late_handshake(bootstrap_room)
            return
        super().update_status(bootstrap_room, status)

    def _aborted_before_handshake(self, room: int) -> bool:
        """D's handshake came after P aborted the room (no rows queued) but before P's scheduler cleared its
        sender: the sender's abort had no D to tell, and its clear would drop the handshake unanswered."""
        sender = self._live_senders.get(room)
        return room in self._aborted_rooms and sender is not None and not sender._rows_queued

    def abandon_room(self, room: int, reason: str | None = None) -> None:
        _remember(self._abandoned_rooms, self._abandon_reasons, room, reason)

    def _refuse_late_handshake(self, room: int) -> None:
        """D handshook for a room P already failed: tell D so now (bootstrap thread), keep nothing of it."""
        from sglang.srt.disaggregation.base.conn import KVPoll

        self._abandoned_rooms.pop(room, None)
        said = self._abandon_reasons.pop(room, None)
        infos = self.transfer_infos.pop(room, None) or {}
        self.req_to_decode_prefix_len.pop(room, None)
        targets = list(dict.fromkeys((info.endpoint, info.dst_port) for info in list(infos.values())
                                     if not info.is_dummy))
        reason = (f"sglang-asym: the prefill worker gave up room {room} before this decode worker's handshake "
                  "came (its bootstrap timeout, or the request was aborted there)") if said is None else said
        log.warning("%s; told %s", reason, targets)
        self.send_kv_status_message(targets=targets, bootstrap_room=room, status=KVPoll.Failed,
                                    failure_reason=reason)

    def conclude_transfer(self, *, bootstrap_room: int, status: Any, **kwargs: Any) -> Any:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if status == KVPoll.Success:
            self._concluded_handshakes[bootstrap_room] = self.transfer_infos.get(bootstrap_room)
        return super().conclude_transfer(bootstrap_room=bootstrap_room, status=status, **kwargs)


def _put_back(manager: Any, room: int, infos: dict) -> None:
    """Restores the next lifecycle's handshake after the previous lifecycle's clear popped it."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    held = manager.transfer_infos.setdefault(room, infos)
    if held is not infos:  # the bootstrap thread started a fresh table meanwhile: merge into it
        for session, info in list(infos.items()):
            held.setdefault(session, info)
    values = list(held.values())
    if values and len(values) >= values[0].required_dst_info_num:
        manager.req_to_decode_prefix_len[room] = next(
            (info.decode_prefix_len for info in values if info.decode_prefix_len is not None), 0)
        manager.update_status(room, KVPoll.WaitingForInput)
    log.info("room %s: D's handshake for its next lifecycle (a rebootstrap) came before P cleared the previous "
             "one; kept", room)


def _fail_once_drained(manager: Any, room: int, targets: Any) -> None:
    """A room aborted on P after some of its rows were queued: D is told Failed once no write into its pages
    is in flight (SGLang counts a chunk as outstanding from its dequeue until its write returned, and a
    chunk dequeued after the abort is skipped), so D frees pages nothing writes to any more. A room that
    does not drain within DRAIN_WAIT_S is left to D's waiting timeout."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    outstanding = getattr(manager, "_staging_outstanding", None)
    if outstanding is None:
        return
    until = time.monotonic() + DRAIN_WAIT_S
    while outstanding.get(room, 0) > 0:
        if time.monotonic() > until:
            log.warning("room %s: aborted on the prefill worker; its writes did not drain in %g s, the decode "
                        "worker is left to its waiting timeout", room, DRAIN_WAIT_S)
            return
        time.sleep(DRAIN_POLL_S)
    log.info("room %s: aborted on the prefill worker after rows were queued; writes drained, told %s", room, targets)
    manager.send_kv_status_message(targets=targets, bootstrap_room=room, status=KVPoll.Failed)


class RoomLifecycleSender:
    """Mixin for a CommonKVSender subclass whose manager has RoomLifecycleManager."""

    def __init__(self, mgr: Any, bootstrap_addr: str, bootstrap_room: int, *args: Any, **kwargs: Any) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        self._room_cleared = False
        self._rows_queued = False
        live = mgr._live_senders
        mgr._abandoned_rooms.pop(bootstrap_room, None)  # a new request of the room: it is not given up
        mgr._abandon_reasons.pop(bootstrap_room, None)
        mgr._aborted_rooms.pop(bootstrap_room, None)
        mgr._abort_reasons.pop(bootstrap_room, None)
        previous = live.get(bootstrap_room)
        if previous is not None and (previous.conclude_state is not None or mgr.request_status.get(bootstrap_room)
                                     in (KVPoll.Success, KVPoll.Failed)):
            log.info("room %s: a new request for the room; its previous, concluded sender is cleared first",
                     bootstrap_room)
            previous.clear()
        super().__init__(mgr, bootstrap_addr, bootstrap_room, *args, **kwargs)
        live[bootstrap_room] = self

    def send(self, *args: Any, **kwargs: Any) -> None:
        self._rows_queued = True
        super().send(*args, **kwargs)

    def abort(self) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        manager, room = self.kv_mgr, self.bootstrap_room
        manager.note_aborted(room)
        super().abort()  # the room is Failed now: the transfer workers skip every chunk they dequeue later
        targets = manager._room_notify_targets(room)
        if targets and not self._rows_queued:
            log.info("room %s: aborted on the prefill worker before any row was queued; told %s", room, targets)
            # the noted abort gives the frame its words (send_kv_status_message)
            manager.send_kv_status_message(targets=targets, bootstrap_room=room, status=KVPoll.Failed)
        elif targets:
            threading.Thread(target=_fail_once_drained, args=(manager, room, targets), daemon=True,
                             name=f"asym-abort-drain-{room}").start()

    def clear(self) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if self._room_cleared:
            return
        self._room_cleared = True
        manager, room = self.kv_mgr, self.bootstrap_room
        live = manager._live_senders
        ended_with = manager._concluded_handshakes.pop(room, _UNKNOWN)
        current = manager.transfer_infos.get(room)
        following = current if ended_with is not _UNKNOWN and current is not None and current is not ended_with \
            else None
        super().clear()
        if self.conclude_state == KVPoll.Failed and not current:
            # failed before D's handshake came: answer a late one (update_status), in the abort's words if P said
            manager.abandon_room(room, manager._abort_reasons.get(room))
        if live.get(room) is self:
            del live[room]
        if following is not None:
            _put_back(manager, room, following)


@functools.lru_cache(maxsize=1)
def stock_mooncake_classes() -> tuple[type, type]:
    """(manager, sender): SGLang's Mooncake classes with the mixins above, for SGLang's own prefill mode."""
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager, MooncakeKVSender

    # a warning, so that servers run at --log-level warning say too that the plugin changed SGLang's own mode
    log.warning("sglang-asym: SGLang's prefill mode on Mooncake: %s (the plugin's room lifecycle)", STOCK_ROOMS_NOTE)
    return (type("RoomLifecycleKVManager", (RoomLifecycleManager, MooncakeKVManager), {}),
            type("RoomLifecycleKVSender", (RoomLifecycleSender, MooncakeKVSender), {}))
