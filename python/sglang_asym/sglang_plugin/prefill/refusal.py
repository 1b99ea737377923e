"""A request the prefill role refuses at its door ends on the decode role at once.

The router sends each request to P and D together. When P's scheduler refuses one before it creates the
room's KV sender (a prompt the split cannot take, more tokens than P's pool holds, any request SGLang's
intake rejects), SGLang says nothing to D: D has admitted the same request, sends its handshake for the
room and waits for a transfer that never comes (its waiting timeout, 300 s by default), holding a slot and
its pages, while the router waits for D. Here P gives the room up in words (room_lifecycle.py's seam on the
exact-payload manager): D's handshake, whether it came already or comes later, is answered with a Failed
status that carries the refusal, its HTTP status and PREFILL_ABORT_WORDS (so D's recompute fallback leaves it
alone), and D ends the request and frees what it held; its client gets P's status and words
(shared/relayed_refusal.py), not a failed transfer's 500.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from ..shared.relayed_refusal import relay_reason

log = logging.getLogger(__name__)


def relay_refusal(kv_manager: Any, room: Any, message: str, status: int | None) -> bool:
    """Tells D that P refused `room` with `status` (now if D's handshake came, else when it comes). False when
    this manager cannot (not the exact-payload manager, or a request without a room)."""
    if room is None or not hasattr(kv_manager, "abandon_room"):
        return False
    room = int(room)
    kv_manager.note_aborted(room)  # the Failed frame says PREFILL_ABORT_WORDS: D does not recompute it
    # a refusal without a status (SGLang's graceful abort) is relayed as a failure of P's: D keeps its 500
    kv_manager.abandon_room(room, relay_reason(room, status or HTTPStatus.INTERNAL_SERVER_ERROR, message))
    if room in kv_manager.transfer_infos:  # D's handshake came before the refusal
        kv_manager._refuse_late_handshake(room)
        kv_manager.request_status.pop(room, None)  # no sender will clear the room's WaitingForInput
    log.info("room %s: refused on the prefill worker; the decode worker is told (%s)", room, message)
    return True
