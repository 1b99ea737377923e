"""Run by test_lifetime.py as a stand-in for a test process: starts P, D, the router and a spawned agent
the way tests do, prints their pids as one JSON line, then waits to be killed.

    python test/system/lifetime_driver.py CHECKPOINT LOG_DIR
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterProcess, pick_free_port
from sglang_asym.testing.server_process import start_server, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # test support: the loopback harness
from support.loopback_rpc import AgentProcess  # noqa: E402


def main(checkpoint: Path, logs: Path) -> None:
    prefill = start_server("asym-prefill", checkpoint, logs)
    decode = start_server("asym-decode", checkpoint, logs)
    for server in (prefill, decode):
        wait_healthy(server, timeout_s=120)
    router = RouterProcess(RouterConfig(prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),),
                                        decode=(decode.url,), port=pick_free_port()), logs / "router.log")
    router.start(ready_timeout_s=60)
    agent = AgentProcess("collections:OrderedDict")  # any importable class: the agent loop is what is checked
    assert agent.info is None
    pids = {"prefill": prefill.proc.pid, "decode": decode.proc.pid, "router": router.pid, "agent": agent.pid}
    ports = {"prefill": prefill.port, "bootstrap": prefill.bootstrap_port, "decode": decode.port,
             "router": router.config.port}
    print(json.dumps({"driver": os.getpid(), "pids": pids, "ports": ports}), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
