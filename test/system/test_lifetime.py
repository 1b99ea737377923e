"""SGLang's servers (launcher, scheduler and detokenizer) and the router die with the process that started
them, even when it is SIGKILLed (test/harness/lifetime.py: the kernel's parent-death signal on the launcher and the
router; SGLang's own on its children): a killed pytest leaves no server behind."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.lifetime import die_with_parent_preexec, parent_death_signal, supported

ROOT = Path(__file__).resolve().parents[2]
GONE_BOUND_S = 5.0  # SIGKILL of the starter -> every process it started is gone and its ports are closed

pytestmark = [pytest.mark.timeout(900), pytest.mark.skipif(not supported(), reason="needs Linux prctl")]

_PRINT_SIGNAL = "from harness.lifetime import parent_death_signal; print(parent_death_signal())"


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(state, process group, start time) from /proc/PID/stat, or None when the pid is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    return fields[0], int(fields[2]), fields[19]


def _group_members(pgid: int) -> dict[int, str]:
    """pid -> start time of every live process in process group `pgid`."""
    members = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] != "Z":
                members[int(entry.name)] = stat[2]
    return members


def _alive(pid: int, start_time: str) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[2] == start_time  # a zombie or a reused pid is gone


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            line = proc.stdout.readline()
            if line.startswith("{"):
                return line
            if not line:
                break
    raise AssertionError(f"driver gave no pid line (exit {proc.poll()})")


def test_preexec_hook_sets_sigkill_in_the_child():
    test_dir = ROOT / "test"  # `-c` code finds the harness in its working directory
    with_hook = subprocess.run([sys.executable, "-c", _PRINT_SIGNAL], capture_output=True, text=True, timeout=30,
                               cwd=test_dir, preexec_fn=die_with_parent_preexec())
    without = subprocess.run([sys.executable, "-c", _PRINT_SIGNAL], capture_output=True, text=True, timeout=30,
                             cwd=test_dir)
    assert (with_hook.stdout.strip(), without.stdout.strip()) == (str(int(signal.SIGKILL)), "0")
    assert parent_death_signal() == 0  # the hook ran in the child only


def test_sigkilled_starter_takes_servers_and_router_with_it(tmp_path, sglang_tiny_checkpoint):
    tracked: dict[int, str] = {}
    checkpoint = sglang_tiny_checkpoint
    driver = subprocess.Popen([sys.executable, str(ROOT / "test" / "system" / "lifetime_driver.py"),
                               str(checkpoint), str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              stderr=(tmp_path / "driver.log").open("w"), preexec_fn=die_with_parent_preexec())
    try:
        started = json.loads(_read_line(driver, timeout_s=600))
        pids = started["pids"]
        for name in ("prefill", "router"):  # own sessions: the group holds any child they made
            members = _group_members(pids[name])
            assert pids[name] in members, (name, members)
            tracked.update(members)
        assert len(tracked) > 3, tracked  # the launcher, its scheduler and detokenizer, and the router
        ports = list(started["ports"].values())
        assert all(_port_open(port) for port in ports), started

        driver.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        driver.wait(10)
        while any(_alive(pid, t) for pid, t in tracked.items()) or any(_port_open(port) for port in ports):
            assert time.monotonic() - killed_at < GONE_BOUND_S, {
                "alive": [pid for pid, t in tracked.items() if _alive(pid, t)],
                "open ports": [port for port in ports if _port_open(port)]}
            time.sleep(0.05)
        print(f"all {len(tracked)} processes gone {time.monotonic() - killed_at:.3f} s after SIGKILL")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        for pid, start_time in tracked.items():
            if _alive(pid, start_time):  # only if the test failed: never leave them behind
                os.kill(pid, signal.SIGKILL)
