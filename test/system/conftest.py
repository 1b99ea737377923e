"""The checkpoint every system test module's servers load: the small V4.1 at SGLang's pool geometry, written
once per test session (and per xdist worker); and the server set several modules share."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_asym.testing.router_launch import RouterFlavor

from .helpers import serving
from .sglang_servers import DETERMINISTIC, patient_router, sglang_server, sglang_workspace, write_sglang_checkpoint


@pytest.fixture(scope="session")
def sglang_checkpoint(tmp_path_factory) -> Path:
    return write_sglang_checkpoint(tmp_path_factory.mktemp("sglang_ckpt"))


@pytest.fixture(scope="package")
def deterministic_stack(sglang_checkpoint, tmp_path_factory):
    """One set of servers with SGLang's --enable-deterministic-inference, started once for the modules that
    compare against the same configuration (the root conftest's DETERMINISTIC_STACK_MODULES, which it runs last
    among their worker's system tests: the set stays up until the package's last test there): a colocated `null` server and an
    asym-prefill / asym-decode pair behind sglang-router, each writing the reference forward's log (a test aid)
    to work/ROLE.jsonl. Each user checks after every case that the set is healthy with empty pools and
    restarts it if not (sglang_servers.restore)."""
    work, logs = sglang_workspace(tmp_path_factory, "sglang_deterministic")

    def started(mode: str, role: str):
        return sglang_server(mode, sglang_checkpoint, logs, DETERMINISTIC,
                             env={"SGLANG_ASYM_FORWARD_LOG": str(work / f"{role}.jsonl")})

    servers = {"colocated": started("null", "colocated"), "prefill": started("asym-prefill", "prefill"),
               "decode": started("asym-decode", "decode")}
    with serving(servers, timeout_s=600):
        with patient_router(servers["prefill"], servers["decode"], RouterFlavor.SGLANG_ROUTER) as router:
            servers.update(work=work, router=router)
            yield servers
