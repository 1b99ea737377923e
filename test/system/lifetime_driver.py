"""Run by test_lifetime.py as a stand-in for a test process: starts an SGLang asym-prefill server and a router in
front of it the way tests do, prints their pids as one JSON line, then waits to be killed. The router names the
one server as its prefill worker and, by `localhost` (the router takes each worker URL once), as its decode
worker: it only has to turn ready (its workers answer /health), and a second SGLang server would add a launch of
the same three processes (launcher, scheduler, detokenizer) under the same parent-death arrangement.

    python test/system/lifetime_driver.py CHECKPOINT LOG_DIR
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # test/: the harness and the system tests, run as a script
from harness.router_launch import PrefillWorker, RouterConfig, RouterProcess  # noqa: E402
from harness.server_process import wait_healthy  # noqa: E402
from system.sglang_servers import sglang_server  # noqa: E402


def main(checkpoint: Path, logs: Path) -> None:
    prefill = sglang_server("asym-prefill", checkpoint, logs)
    wait_healthy(prefill, timeout_s=600)
    router = RouterProcess(RouterConfig(prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),),
                                        decode=(prefill.url.replace("127.0.0.1", "localhost"),)),
                           logs / "router.log")
    router.start(ready_timeout_s=180)
    pids = {"prefill": prefill.proc.pid, "router": router.pid}
    ports = {"prefill": prefill.port, "bootstrap": prefill.bootstrap_port, "router": router.config.port}
    print(json.dumps({"driver": os.getpid(), "pids": pids, "ports": ports}), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
