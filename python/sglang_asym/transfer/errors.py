"""Exceptions of the transfer layer. Each names the room or the field that is wrong."""

from __future__ import annotations


class TransferError(Exception):
    """A request's transfer failed; `reason` is what `Sender/Receiver.failure_reason` report."""

    def __init__(self, bootstrap_room: int, reason: str):
        super().__init__(f"bootstrap_room={bootstrap_room}: {reason}")
        self.bootstrap_room = bootstrap_room
        self.reason = reason


class ProtocolError(ValueError):
    """A control message could not be decoded (bad version, unknown type, malformed fields)."""


class DuplicateRoomError(ValueError):
    """A bootstrap_room is already active on this worker."""


class SlotsExhaustedError(RuntimeError):
    """A destination pool has fewer free slots than a request needs."""


class EngineError(RuntimeError):
    """The Mooncake engine returned an error code."""


class WriteFailedError(EngineError):
    """A batch write returned -1: the destination may be PARTIALLY written."""


class UnregisteredMemoryError(EngineError):
    """A source range lies outside every memory region registered with the engine."""
