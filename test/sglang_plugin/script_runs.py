"""How the plugin tests run Python in a process of its own: helper scripts and `-m` modules through one fork
runner per test process (fork_runner.py: the imports every one of them starts with are paid once), anything else
(`-c` code, or extra environment read at import time) as a fresh interpreter."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from harness.lifetime import die_with_parent_preexec

RUNNER = Path(__file__).resolve().with_name("fork_runner.py")
RUNNER_START_S = 120.0  # the runner's own imports, on a loaded 2-core host


TEST_DIR = Path(__file__).resolve().parents[1]  # on the path of every process started here: the harness


def python_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process these tests start: only this plugin allowed, no warnings, test/ (the
    harness) on the path."""
    path = os.pathsep.join(p for p in (str(TEST_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, SGLANG_PLUGINS="sglang_asym", PYTHONWARNINGS="ignore", PYTHONPATH=path,
                **(extra_env or {}))


class ForkRunner:
    """One fork_runner.py process, started on first use and asked for one script run at a time."""

    def __init__(self, cwd: Path) -> None:
        self._cwd = cwd
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _started(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, str(RUNNER)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, env=python_env(), cwd=self._cwd,
                                          preexec_fn=die_with_parent_preexec())
        return self._proc

    def _answer(self, proc: subprocess.Popen, timeout_s: float) -> dict | None:
        if not select.select([proc.stdout], [], [], timeout_s)[0]:
            return None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork runner exited with {proc.wait()}")
        return json.loads(line)

    def run(self, args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
        """`python *args` (a script or `-m module`, then its arguments) as a forked child: its exit status, stdout and
        stderr."""
        with self._lock, tempfile.TemporaryDirectory(prefix="script-run-") as work:
            out, err = Path(work, "stdout"), Path(work, "stderr")
            proc = self._started()
            proc.stdin.write(json.dumps({"argv": args, "cwd": str(self._cwd), "stdout": str(out),
                                         "stderr": str(err)}) + "\n")
            proc.stdin.flush()
            forked = self._answer(proc, RUNNER_START_S)
            if forked is None:
                raise RuntimeError(f"the fork runner did not fork within {RUNNER_START_S} s")
            ended = self._answer(proc, timeout_s)
            if ended is None:
                os.kill(forked["pid"], signal.SIGKILL)
                self._answer(proc, RUNNER_START_S)
                raise subprocess.TimeoutExpired([sys.executable, *args], timeout_s, out.read_text(), err.read_text())
            return subprocess.CompletedProcess([sys.executable, *args], ended["returncode"],
                                               out.read_text(errors="replace"), err.read_text(errors="replace"))

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(30)
