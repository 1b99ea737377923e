"""Children that die with the process that started them: Linux's parent-death signal (prctl PR_SET_PDEATHSIG).

A server or router started by a test, benchmark or the demo must not outlive its starter, even when the
starter is killed with SIGKILL and runs no cleanup. The kernel can do this for us: a process that asked
for a parent-death signal receives it when its parent exits, however the parent ends.

    subprocess.Popen(cmd, preexec_fn=die_with_parent_preexec())   # a child we exec
    die_with_parent(expected_parent=ppid)                           # first thing in a spawned Python child

Two properties of the kernel mechanism callers must know:
- "Parent" is the thread that forked the child: start children from a thread that lives as long as they
  should (every launcher in this project is called from the main thread).
- The setting survives exec but is not inherited by the child's own children; a server that starts
  processes of its own must ask for them (SGLang's scheduler processes do).
On systems without prctl (not Linux) `die_with_parent_preexec()` returns None and children are only
stopped by the launchers' own `stop()`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from typing import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_GET_PDEATHSIG = 2


class LifetimeError(OSError):
    """prctl refused to set or read the parent-death signal."""


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = libc.prctl
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return fn


# Resolved once at import, in the parent: a forked child must not dlopen (locks held by other threads).
_PRCTL = _load_prctl()


def supported() -> bool:
    return _PRCTL is not None


def _set(sig: int) -> None:
    if _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise LifetimeError(err, f"prctl(PR_SET_PDEATHSIG, {int(sig)}) failed: {os.strerror(err)}")


def parent_death_signal() -> int:
    """The signal this process gets when its parent exits (0: none)."""
    if _PRCTL is None:
        return 0
    out = ctypes.c_int(0)
    if _PRCTL(PR_GET_PDEATHSIG, ctypes.addressof(out), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise LifetimeError(err, f"prctl(PR_GET_PDEATHSIG) failed: {os.strerror(err)}")
    return out.value


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> None:
    """Ask for `sig` when this process's parent exits. If the parent is already gone (our parent pid is
    no longer `expected_parent`), the signal would never come: send it to ourselves now."""
    if _PRCTL is None:
        return
    _set(sig)
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)


def die_with_parent_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets `sig` when the calling process (thread) exits.
    None where the mechanism is missing, so it can be passed to Popen unconditionally."""
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def hook() -> None:
        die_with_parent(sig, expected_parent=parent)

    return hook
