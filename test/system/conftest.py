"""The system tests' checkpoints (small and tiny, at SGLang's pool geometry) and their shared server set.

Each checkpoint is written once per test session (and per xdist worker): the small V4.1 with the 40-layer
schedule for the asym pair's module, and the nine-layer tiny one (every layer role) for every other module,
whose subject is the serving path rather than that schedule: a request costs about a third there."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.router_launch import RouterFlavor

from .helpers import serving
from .sglang_servers import (DETERMINISTIC, STACK_P_POOL_TOKENS, patient_router, sglang_server, sglang_workspace,
                             write_sglang_checkpoint)


@pytest.fixture(scope="session")
def sglang_checkpoint(tmp_path_factory) -> Path:
    return write_sglang_checkpoint(tmp_path_factory.mktemp("sglang_ckpt"))


@pytest.fixture(scope="session")
def sglang_tiny_checkpoint(tmp_path_factory) -> Path:
    from harness.sglang_shapes import sglang_tiny

    return write_sglang_checkpoint(tmp_path_factory.mktemp("sglang_tiny_ckpt"), sglang_tiny())


@pytest.fixture(scope="package")
def deterministic_stack(sglang_tiny_checkpoint, tmp_path_factory):
    """One set of servers on the tiny checkpoint with SGLang's --enable-deterministic-inference, started once
    for the modules that compare against the same configuration (the root conftest's DETERMINISTIC_STACK_MODULES,
    which it runs last among their worker's system tests: the set stays up until the package's last test there):
    a colocated `null` server and an asym-prefill / asym-decode pair behind sglang-router, each writing the
    reference forward's log (a test aid) to work/ROLE.jsonl. P's pool holds STACK_P_POOL_TOKENS, fewer than D's:
    the real clients' module has P alone refuse a prompt D would take. Each user checks after every case that
    the set is healthy with empty pools and restarts it if not (sglang_servers.restore)."""
    work, logs = sglang_workspace(tmp_path_factory, "sglang_deterministic")

    def started(mode: str, role: str, *flags: str):
        return sglang_server(mode, sglang_tiny_checkpoint, logs, DETERMINISTIC, *flags,
                             env={"SGLANG_ASYM_FORWARD_LOG": str(work / f"{role}.jsonl")})

    servers = {"colocated": started("null", "colocated"),
               "prefill": started("asym-prefill", "prefill", "--max-total-tokens", str(STACK_P_POOL_TOKENS)),
               "decode": started("asym-decode", "decode")}
    with serving(servers, timeout_s=600):
        with patient_router(servers["prefill"], servers["decode"], RouterFlavor.SGLANG_ROUTER) as router:
            servers.update(work=work, router=router)
            yield servers
