"""The two threads every transfer manager runs.

ServiceLoop: receives control messages and runs a periodic tick (deadlines, heartbeats),
so a request's state advances even when nobody polls it.
TaskWorker: runs blocking work (Mooncake writes, checksums, bootstrap HTTP) in FIFO order;
per-room ordering (write, write, ..., complete) follows from the FIFO.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

from sglang_asym.transfer.channel import Channel

logger = logging.getLogger(__name__)

MAX_MESSAGES_PER_TICK = 1024


class ServiceLoop:
    def __init__(self, name: str, channel: Channel, on_message: Callable[[Any], None],
                 on_tick: Callable[[float], None], tick_s: float):
        self._channel, self._on_message, self._on_tick, self._tick_s = channel, on_message, on_tick, tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            msg = self._channel.recv(timeout_s=max(0.0, next_tick - time.monotonic()))
            try:
                # Drain what is queued before judging deadlines: after this process was frozen
                # (SIGSTOP), the peer's answers wait in the socket and must count first.
                for _ in range(MAX_MESSAGES_PER_TICK):
                    if msg is None:
                        break
                    self._on_message(msg)
                    msg = self._channel.recv(timeout_s=0)
                now = time.monotonic()
                if now >= next_tick:
                    self._on_tick(now)
                    next_tick = now + self._tick_s
            except Exception:  # a bug in one handler must not kill the worker's transfers
                logger.exception("transfer service loop handler failed")

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)


class TaskWorker:
    def __init__(self, name: str):
        self._tasks: queue.Queue = queue.Queue()
        self._unfinished = 0   # tasks submitted and not yet returned
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._count_lock:
            self._unfinished += 1
        self._tasks.put((fn, args))

    def _run(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except Exception:
                logger.exception("transfer task %s failed", getattr(fn, "__name__", fn))
            finally:
                with self._count_lock:
                    self._unfinished -= 1

    @property
    def idle(self) -> bool:
        """No task queued or running. Stays true until someone submits, so a caller that is the
        only one submitting (holding the lock all submitters take) may rely on it."""
        with self._count_lock:
            return self._unfinished == 0

    def stop(self, timeout_s: float = 10.0) -> None:
        self._tasks.put(None)
        self._thread.join(timeout_s)
