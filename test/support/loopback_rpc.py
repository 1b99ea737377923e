"""Run an object in a spawned child process and call its methods over a pipe, with timeouts.

Used by the transfer tests and benchmark to host one prefill and one decode worker on
127.0.0.1 (spawn start method: Mooncake engines must be created after the child starts). An agent gets
SIGKILL when its starter exits, even by SIGKILL (testing/lifetime.py).
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing as mp
import os
import signal
import time
import traceback
from typing import Any

from sglang_asym.testing.lifetime import die_with_parent


_NOT_READY = object()


class AgentError(RuntimeError):
    def __init__(self, kind: str, message: str, trace: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.trace = trace


def _agent_main(conn, target: str, kwargs: dict, parent_pid: int) -> None:
    die_with_parent(signal.SIGKILL, expected_parent=parent_pid)
    logging.basicConfig(level=os.environ.get("SGLANG_ASYM_AGENT_LOG", "WARNING"),
                        format=f"%(asctime)s [agent {os.getpid()}] %(name)s: %(message)s")
    module, _, name = target.partition(":")
    try:
        agent = getattr(importlib.import_module(module), name)(**kwargs)
        conn.send((0, "ok", getattr(agent, "info", lambda: None)()))
    except BaseException as exc:
        conn.send((0, "error", type(exc).__name__, str(exc), traceback.format_exc()))
        return
    while True:
        seq, method, call_kwargs = conn.recv()
        if method == "__stop__":
            getattr(agent, "close", lambda: None)()
            conn.send((seq, "ok", None))
            return
        try:
            conn.send((seq, "ok", getattr(agent, method)(**call_kwargs)))
        except Exception as exc:
            conn.send((seq, "error", type(exc).__name__, str(exc), traceback.format_exc()))


class AgentProcess:
    """`target` is "module:Class"; the class is built in the child with `kwargs`.

    The constructor returns as soon as the child is spawned, so several agents start in
    parallel; the first access to `info` waits until this one is ready.
    """

    def __init__(self, target: str, start_timeout_s: float = 60.0, env: dict[str, str] | None = None, **kwargs):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        saved = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})  # spawn children inherit the environment at start()
        try:
            self.process = ctx.Process(target=_agent_main, args=(child, target, kwargs, os.getpid()),
                                       daemon=True)
            self.process.start()
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        child.close()
        self._start_timeout_s = start_timeout_s
        self._info: Any = _NOT_READY
        self._seq = 0

    @property
    def info(self) -> Any:
        """What the agent's `info()` returned; waits for the agent to finish starting."""
        if self._info is _NOT_READY:
            self._info = self._reply(self._start_timeout_s, "start")
        return self._info

    @property
    def pid(self) -> int:
        return self.process.pid

    def _reply(self, timeout_s: float, what: str, seq: int = 0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:  # answers to earlier calls that timed out are skipped
            if not self._conn.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"agent {self.pid}: no answer to {what} within {timeout_s}s")
            reply = self._conn.recv()
            if reply[0] == seq:
                break
        if reply[1] == "error":
            raise AgentError(*reply[2:])
        return reply[2]

    def call(self, method: str, *, rpc_timeout_s: float = 30.0, **kwargs) -> Any:
        self._seq += 1
        self._conn.send((self._seq, method, kwargs))
        return self._reply(rpc_timeout_s, method, self._seq)

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self._conn.close()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Close the agent cleanly, killing it if it does not answer in time."""
        if self.process.is_alive():
            try:
                self.thaw()
                self.call("__stop__", rpc_timeout_s=timeout_s)
                self.process.join(timeout_s)
            except (TimeoutError, OSError, EOFError, AgentError):
                pass
        self.kill()
