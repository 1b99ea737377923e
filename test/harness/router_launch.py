"""Start the real PD router (sglang-router 0.3.2 or its successor smg 1.13) as a subprocess, and stop it.

    with RouterProcess(RouterConfig(prefill=(PrefillWorker(p_url, 8998),), decode=(d_url,))) as r:
        ...  # r.url serves /generate, /v1/completions, /v1/chat/completions (port 0: a free one, see below)

Both flavors take the same flags (`python -m sglang_router.launch_router` / `python -m smg.launch_router`,
`--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL`). At start they probe each worker for
gRPC (an HTTP/2 preface), then call GET /health, /server_info, /model_info (smg also /v1/models,
/version, /loads, /v1/loads, /metrics) and register the workers in the background; `/readiness` turns
200 once both a prefill and a decode worker are healthy, which is what `start()` waits for. SIGTERM
starts a graceful shutdown bounded by `--shutdown-grace-period-secs`; `stop()` escalates to SIGKILL.
The router gets SIGKILL when the process (thread) that started it exits, even by SIGKILL (lifetime.py).

Per request (both flavors, as measured on sglang-router 0.3.2 and smg 1.13): the body, re-serialized, goes to
P and D at once with `bootstrap_host` (P's host), `bootstrap_port` and a fresh random `bootstrap_room`
(lists of them for a list `prompt`); the client gets D's body, released only after P has answered.
sglang-router adds its own default fields, drops unknown ones, passes `sampling_params` floats through
f32 and renames chat `max_tokens` to `max_completion_tokens`; both reject a batch /generate (422).
A P 400 comes back as 400 (`prefill_bad_request`) without retry; a P 409/500/503 or a dropped connection
is retried (with new rooms, D gets a copy each time) up to `retry_max_retries` attempts, then 500/503/502.
On a P failure smg drops D's copy (D sees a disconnect); sglang-router waits for D's whole answer
first, so D must time out a transfer that never comes on its own.

Dead workers: the routers' circuit breaker records one outcome per PD request, the client's status, on
both workers of the pair, so a dead D's failures open the healthy P's circuit as well (sglang-router
0.3.2: twelve failures took P out of rotation for its 60 s breaker timeout). Their health checks probe
each worker on its own. `WorkerHealth` turns the breaker off and lets short health checks decide
(test/system/test_dead_peer.py measures the time to serve again).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from harness.lifetime import die_with_parent_preexec


class RouterFlavor(str, Enum):
    SGLANG_ROUTER = "sglang_router"  # PyPI sglang-router 0.3.2
    SMG = "smg"  # PyPI smg 1.13.0

    @property
    def module(self) -> str:
        return f"{self.value}.launch_router"


@dataclass(frozen=True)
class PrefillWorker:
    url: str
    bootstrap_port: int | None = None  # P's bootstrap server; None sends no bootstrap_port


@dataclass(frozen=True)
class WorkerHealth:
    """Per-worker failure detection by the router's health checks (GET /health on each worker), with the
    pair-level circuit breaker off. A worker is out of rotation after `failure_threshold` failed checks
    and back after `success_threshold` good ones, `interval_s` apart."""

    interval_s: int = 1
    timeout_s: int = 5
    failure_threshold: int = 2
    success_threshold: int = 1

    def args(self) -> list[str]:
        return ["--disable-circuit-breaker", "--health-check-interval-secs", str(self.interval_s),
                "--health-check-timeout-secs", str(self.timeout_s),
                "--health-failure-threshold", str(self.failure_threshold),
                "--health-success-threshold", str(self.success_threshold)]


@dataclass(frozen=True)
class RouterConfig:
    prefill: tuple[PrefillWorker, ...]
    decode: tuple[str, ...]
    port: int = 0  # 0: a free port, picked again if another process takes it before the router binds it
    prometheus_port: int | None = None  # None: a free port (the default 29000 would clash between routers)
    host: str = "127.0.0.1"
    flavor: RouterFlavor = RouterFlavor.SGLANG_ROUTER
    policy: str | None = None  # router default: cache_aware
    request_timeout_s: int | None = None  # router default: 1800
    retry_max_retries: int | None = None  # router default: 5 attempts; 1 disables retries
    worker_startup_timeout_s: int = 120
    worker_startup_check_interval_s: int = 1  # router default 30 s: too slow when workers start after it
    shutdown_grace_period_s: int = 1  # router default 180 s
    log_level: str = "warn"
    health: WorkerHealth | None = None  # None: the router's defaults (circuit breaker on)
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.prefill or not self.decode:
            raise ValueError("a PD router needs at least one prefill and one decode worker")
        for url in [p.url for p in self.prefill] + list(self.decode):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker url must start with http:// or https://, got {url!r}")

    def command(self, prometheus_port: int, python: str = sys.executable) -> list[str]:
        cmd = [python, "-m", self.flavor.module, "--pd-disaggregation", "--host", self.host, "--port", str(self.port),
               "--prometheus-host", self.host, "--prometheus-port", str(prometheus_port),
               "--worker-startup-timeout-secs", str(self.worker_startup_timeout_s),
               "--worker-startup-check-interval", str(self.worker_startup_check_interval_s),
               "--shutdown-grace-period-secs", str(self.shutdown_grace_period_s), "--log-level", self.log_level]
        for p in self.prefill:
            cmd += ["--prefill", p.url] + ([str(p.bootstrap_port)] if p.bootstrap_port is not None else [])
        for d in self.decode:
            cmd += ["--decode", d]
        optional = {"--policy": self.policy, "--request-timeout-secs": self.request_timeout_s,
                    "--retry-max-retries": self.retry_max_retries}
        for flag, value in optional.items():
            if value is not None:
                cmd += [flag, str(value)]
        if self.health is not None:
            cmd += self.health.args()
        return cmd + list(self.extra_args)


class RouterStartError(RuntimeError):
    """The router exited or did not become ready in time; the message carries its log tail."""

    @property
    def port_taken(self) -> bool:
        return "Address already in use" in str(self)


_PORT_ATTEMPTS = 3


def pick_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class RouterProcess:
    """One router subprocess (its own process group) with bounded start and stop."""

    def __init__(self, config: RouterConfig, log_path: str | Path | None = None) -> None:
        self.config = config
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="router-", suffix=".log")
            os.close(fd)
        self._log_path = Path(log_path)
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Start the router and wait for /readiness. A port picked here (config port 0, prometheus None) is
        only free when picked: another process may bind it before the router does (the router then exits
        with EADDRINUSE), so such a start is retried on fresh ports, `_PORT_ATTEMPTS` times at most."""
        if self._proc is not None:
            raise RuntimeError("router already started")
        picks_ports = self.config.port == 0 or self.config.prometheus_port is None
        wanted = self.config
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self.config = replace(wanted, port=wanted.port or pick_free_port(wanted.host))
            prometheus_port = wanted.prometheus_port or pick_free_port(wanted.host)
            with self._log_path.open("wb") as log:
                self._proc = subprocess.Popen(self.config.command(prometheus_port), stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True, preexec_fn=die_with_parent_preexec())
            try:
                self._wait_ready(ready_timeout_s)
                return
            except RouterStartError as exc:
                self.stop()
                if not (picks_ports and exc.port_taken and attempt < _PORT_ATTEMPTS):
                    raise
            except BaseException:
                self.stop()
                raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RouterStartError(f"router exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/readiness", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read()[:200]!r}"
            except OSError as exc:
                last = repr(exc)
            time.sleep(0.1)
        raise RouterStartError(f"router not ready after {timeout_s}s (last /readiness: {last}):\n{self.log_tail()}")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the router's process group, SIGKILL it after timeout_s; returns the exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait(timeout_s)
        return proc.returncode

    @staticmethod
    def _signal_group(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the group we created with start_new_session: the router and its children
        except ProcessLookupError:
            pass

    def log_tail(self, max_lines: int = 40) -> str:
        try:
            lines = self._log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no router log)"
        return "\n".join(lines[-max_lines:])

    def __enter__(self) -> RouterProcess:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
