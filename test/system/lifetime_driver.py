"""Run by test_lifetime.py as a stand-in for a test process: starts SGLang's asym-prefill and asym-decode
servers and the router the way tests do, prints their pids as one JSON line, then waits to be killed.

    python test/system/lifetime_driver.py CHECKPOINT LOG_DIR
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterProcess
from sglang_asym.testing.server_process import wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the system test package, run as a script
from system.sglang_servers import sglang_server  # noqa: E402


def main(checkpoint: Path, logs: Path) -> None:
    prefill = sglang_server("asym-prefill", checkpoint, logs)
    decode = sglang_server("asym-decode", checkpoint, logs)
    for server in (prefill, decode):
        wait_healthy(server, timeout_s=600)
    router = RouterProcess(RouterConfig(prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),),
                                        decode=(decode.url,)), logs / "router.log")
    router.start(ready_timeout_s=180)
    pids = {"prefill": prefill.proc.pid, "decode": decode.proc.pid, "router": router.pid}
    ports = {"prefill": prefill.port, "bootstrap": prefill.bootstrap_port, "decode": decode.port,
             "router": router.config.port}
    print(json.dumps({"driver": os.getpid(), "pids": pids, "ports": ports}), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
