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

The two mixins below (on the exact-payload manager and its sender, exact_payload.py) keep the second
lifecycle's handshake:
  manager  conclude_transfer  remembers which handshake the concluded lifecycle had
  sender   clear              pops only the concluded lifecycle: a handshake that is not the remembered
                              one is put back afterwards, with its prefix length and WaitingForInput
  sender   __init__           a new sender for a room whose previous sender concluded but was not
                              cleared yet clears that one first (else the new one would read Success);
                              `clear()` runs once per sender
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_UNKNOWN = object()


class RoomLifecycleManager:
    """Mixin for a CommonKVManager subclass (P side)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._live_senders: dict[int, Any] = {}  # room -> its sender not cleared yet (scheduler thread)
        self._concluded_handshakes: dict[int, Any] = {}  # room -> the handshake table its Success ended with
        super().__init__(*args, **kwargs)

    def conclude_transfer(self, *, bootstrap_room: int, status: Any, **kwargs: Any) -> Any:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if status == KVPoll.Success:
            self._concluded_handshakes[bootstrap_room] = self.transfer_infos.get(bootstrap_room)
        return super().conclude_transfer(bootstrap_room=bootstrap_room, status=status, **kwargs)

    def room_lifecycles_open(self) -> int:
        """Senders not cleared yet plus concluded lifecycles awaiting their clear (0 when P is idle)."""
        return len(self._live_senders) + len(self._concluded_handshakes)


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


class RoomLifecycleSender:
    """Mixin for a CommonKVSender subclass whose manager has RoomLifecycleManager."""

    def __init__(self, mgr: Any, bootstrap_addr: str, bootstrap_room: int, *args: Any, **kwargs: Any) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        self._room_cleared = False
        live = mgr._live_senders
        previous = live.get(bootstrap_room)
        if previous is not None and (previous.conclude_state is not None or mgr.request_status.get(bootstrap_room)
                                     in (KVPoll.Success, KVPoll.Failed)):
            log.info("room %s: a new request for the room; its previous, concluded sender is cleared first",
                     bootstrap_room)
            previous.clear()
        super().__init__(mgr, bootstrap_addr, bootstrap_room, *args, **kwargs)
        live[bootstrap_room] = self

    def clear(self) -> None:
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
        if live.get(room) is self:
            del live[room]
        if following is not None:
            _put_back(manager, room, following)
