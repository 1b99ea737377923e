"""A request the prefill role refuses at its door ends on the decode role at once.

The router sends each request to P and D together. When P's scheduler refuses one before it creates the
room's KV sender (a prompt the split cannot take, more tokens than P's pool holds, any request SGLang's
intake rejects), SGLang says nothing to D: D has admitted the same request, sends its handshake for the
room and waits for a transfer that never comes (its waiting timeout, 300 s by default), holding a slot and
its pages, while the router waits for D. Here P gives the room up in words (room_lifecycle.py's seam on the
exact-payload manager): D's handshake, whether it came already or comes later, is answered with a Failed
status that carries the refusal and PREFILL_ABORT_WORDS (so D's recompute fallback leaves it alone), and D
ends the request and frees what it held.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def relay_refusal(kv_manager: Any, room: Any, message: str) -> bool:
    """Tells D that P refused `room` (now if D's handshake came, else when it comes). False when this
    manager cannot (not the exact-payload manager, or a request without a room)."""
    if room is None or not hasattr(kv_manager, "abandon_room"):
        return False
    room = int(room)
    kv_manager.note_aborted(room)  # the Failed frame says PREFILL_ABORT_WORDS: D does not recompute it
    kv_manager.abandon_room(room, f"sglang-asym: the prefill worker refused the request of room {room}: {message}")
    if room in kv_manager.transfer_infos:  # D's handshake came before the refusal
        kv_manager._refuse_late_handshake(room)
        kv_manager.request_status.pop(room, None)  # no sender will clear the room's WaitingForInput
    log.info("room %s: refused on the prefill worker; the decode worker is told (%s)", room, message)
    return True
