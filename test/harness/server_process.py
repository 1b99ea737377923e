"""Start, health-check and stop real server processes (by default SGLang's `python -m sglang.launch_server`;
demo, benchmarks, tests), and small HTTP helpers to talk to them.

Every server started here gets SIGKILL when the process (thread) that started it exits, however it exits
(test/harness/lifetime.py): a killed pytest or benchmark leaves no server behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness.lifetime import die_with_parent_preexec
from harness.router_launch import pick_free_port


@dataclass
class ServerProcess:
    mode: str
    port: int
    proc: subprocess.Popen
    log: Path
    bootstrap_port: int | None = None
    args: tuple[str, ...] = ()  # the command line, its ports included: restarted() runs it again
    env: dict[str, str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def rss_mb(self) -> float:
        """Resident memory of the server process now (VmRSS), in MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def restarted(self) -> "ServerProcess":
        """The same command started again on the same ports (stop this one first), logging to a new file."""
        assert self.proc.poll() is not None, f"{self.mode}: restart needs the server stopped first"
        return _launch(self.mode, self.port, self.bootstrap_port, self.args, self.env, self.log.parent)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)


def start_server(mode: str, model_path: Path, log_dir: Path, *extra: str, module: str = "sglang.launch_server",
                 python: str = sys.executable, served_name: str = "v41-small",
                 env: dict[str, str] | None = None, port: int | None = None,
                 bootstrap_port: int | None = None) -> ServerProcess:
    """Start one server; `port` / `bootstrap_port` (default: free ports) restart a worker where it was."""
    port = port or pick_free_port()
    bootstrap = (bootstrap_port or pick_free_port()) if mode in ("asym-prefill", "prefill") else None
    args = [python, "-m", module, "--model-path", str(model_path), "--port", str(port),
            "--disaggregation-mode", mode, "--log-level", "warning", "--served-model-name", served_name, *extra]
    if bootstrap is not None:
        args += ["--disaggregation-bootstrap-port", str(bootstrap)]
    env = {**os.environ, "MC_LOG_LEVEL": "ERROR", "PYTHONUNBUFFERED": "1", **(env or {})}
    return _launch(mode, port, bootstrap, tuple(args), env, log_dir)


def _launch(mode: str, port: int, bootstrap: int | None, args: tuple[str, ...], env: dict[str, str],
            log_dir: Path) -> ServerProcess:
    log = log_dir / f"{mode}-{port}.log"
    restarts = 0
    while log.exists():  # a restart on the same port keeps the earlier run's log
        restarts += 1
        log = log_dir / f"{mode}-{port}-restart{restarts}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, preexec_fn=die_with_parent_preexec())
    return ServerProcess(mode, port, proc, log, bootstrap, args, env)


class PortTaken(RuntimeError):
    """The server could not bind a port picked for it: another process took it between the pick and the bind
    (a minute later, after the model loaded). SGLang's launcher then logs the error and keeps running."""


PORT_TAKEN = "address already in use"  # uvicorn's and aiohttp's words for errno 98 (EADDRINUSE)
FRESH_PORT_ATTEMPTS = 3


def wait_healthy(server: ServerProcess, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.mode} server exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            taken = _taken_port_line(server)
            if taken:
                raise PortTaken(f"{server.mode} server: a port picked for it was taken before it bound it: "
                                f"{taken}") from None
        time.sleep(0.3)
    raise TimeoutError(f"{server.mode} server not healthy after {timeout_s} s:\n{server.log_tail()}")


def _taken_port_line(server: ServerProcess) -> str | None:
    """The log line saying that one of the ports picked for `server` was in use (other components, Mooncake's
    among them, may retry other ports of their own in use: those lines name no port of ours)."""
    ours = [f"'127.0.0.1', {port})" for port in (server.port, server.bootstrap_port) if port]
    for line in server.log.read_text(errors="replace").splitlines():
        if PORT_TAKEN in line.lower() and any(port in line for port in ours):
            return line.strip()
    return None


def healthy_on_fresh_ports(server: ServerProcess, timeout_s: float = 180.0) -> ServerProcess:
    """`server` once healthy; if a port picked for it was taken before it bound it, the same command again on
    freshly picked ports (at most FRESH_PORT_ATTEMPTS starts), so only for a first start, not a restart."""
    for attempt in range(1, FRESH_PORT_ATTEMPTS + 1):
        try:
            wait_healthy(server, timeout_s)
            return server
        except PortTaken as exc:
            server.stop()
            if attempt == FRESH_PORT_ATTEMPTS:
                raise
            print(f"{exc}\nstarting it again on fresh ports", file=sys.stderr)
            server = _on_fresh_ports(server)
    raise AssertionError("unreachable")


def _on_fresh_ports(server: ServerProcess) -> ServerProcess:
    args = list(server.args)
    port = pick_free_port()
    args[args.index("--port") + 1] = str(port)
    bootstrap = None
    if "--disaggregation-bootstrap-port" in args:
        bootstrap = pick_free_port()
        args[args.index("--disaggregation-bootstrap-port") + 1] = str(bootstrap)
    return _launch(server.mode, port, bootstrap, tuple(args), server.env, server.log.parent)


def post(url: str, body: dict | bytes, timeout_s: float = 300.0) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except json.JSONDecodeError:
            return exc.code, {"raw": raw.decode(errors="replace")}


def post_stream(url: str, body: dict, timeout_s: float = 300.0) -> list[dict]:
    """SSE: the parsed `data:` events before `[DONE]`."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                break
            events.append(json.loads(payload))
    return events
