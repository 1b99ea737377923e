"""ZMQ plumbing: one PULL socket per worker for incoming control messages, one PUSH
socket per peer endpoint for outgoing ones.

Only the service thread receives. Any thread may send: ZMQ sockets are not thread-safe,
so sends are serialised by a lock. Sends never block: a full queue to a peer (a dead or
frozen one) raises `PeerUnreachableError` instead of stalling the caller.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import zmq

from sglang_asym.transfer import codec
from sglang_asym.transfer.errors import ProtocolError

logger = logging.getLogger(__name__)

SEND_HIGH_WATER_MARK = 4096


class PeerUnreachableError(RuntimeError):
    pass


class Channel:
    def __init__(self, host: str):
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        port = self._pull.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{port}"
        self.port = port
        self._push: dict[str, zmq.Socket] = {}
        self._send_lock = threading.Lock()
        self._poller = zmq.Poller()
        self._poller.register(self._pull, zmq.POLLIN)
        self.malformed_messages = 0
        self.last_received_at = 0.0  # monotonic time the last message came off the socket (before decoding)

    def send(self, endpoint: str, msg: Any) -> None:
        data = codec.encode(msg)
        with self._send_lock:
            sock = self._push.get(endpoint)
            if sock is None:
                sock = self._ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, SEND_HIGH_WATER_MARK)
                sock.connect(endpoint)
                self._push[endpoint] = sock
            try:
                sock.send(data, flags=zmq.NOBLOCK)
            except zmq.Again as exc:
                raise PeerUnreachableError(f"send queue to {endpoint} is full (peer dead or frozen)") from exc

    def try_send(self, endpoint: str, msg: Any) -> bool:
        """Best-effort send (failure notices to a peer that may be gone)."""
        try:
            self.send(endpoint, msg)
            return True
        except PeerUnreachableError as exc:
            logger.warning("dropping %s: %s", type(msg).__name__, exc)
            return False

    def recv(self, timeout_s: float) -> Any | None:
        """The next decoded message, or None after `timeout_s`. Malformed input is logged and dropped."""
        if not self._poller.poll(int(timeout_s * 1000)):
            return None
        data = self._pull.recv(flags=zmq.NOBLOCK)
        self.last_received_at = time.monotonic()
        try:
            return codec.decode(data)
        except ProtocolError as exc:
            self.malformed_messages += 1
            logger.error("dropping control message on %s: %s", self.endpoint, exc)
            return None

    def close(self) -> None:
        with self._send_lock:
            for sock in self._push.values():
                sock.close(linger=0)
            self._push.clear()
        self._pull.close(linger=0)
        self._ctx.term()
