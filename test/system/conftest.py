"""A small checkpoint and the P / D / colocated servers, started once per test session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglang_asym.testing.server_process import start_server

from .helpers import serving

ROOT = Path(__file__).resolve().parents[2]
D_TRANSFER_TIMEOUT_S = 8


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "v41-small"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_checkpoint.py"), "--config", "small", "--seed", "0",
                    "--out", str(out), "--quiet"], check=True, timeout=600)
    return out


@pytest.fixture(scope="session")
def cluster(small_checkpoint, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    # Deterministic inference: concurrent requests through the pair are compared token for token with the
    # colocated server's answers one at a time. Without it a request's logits depend on what it is batched
    # with, and on AVX2-only hosts (bf16 kernels chosen by row count) that flipped a near tie of a random-
    # weight checkpoint in two of four runs.
    same = ("--enable-deterministic-inference",)
    servers = {
        "prefill": start_server("asym-prefill", small_checkpoint, logs, *same),
        "decode": start_server("asym-decode", small_checkpoint, logs, "--transfer-timeout", str(D_TRANSFER_TIMEOUT_S),
                               *same),
        "colocated": start_server("null", small_checkpoint, logs, *same),
    }
    with serving(servers):
        yield servers


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """The `tiny` preset (one shard, seconds to load): for process tests that do not need the real schedule."""
    out = tmp_path_factory.mktemp("ckpt") / "v41-tiny"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_checkpoint.py"), "--config", "tiny", "--seed", "0",
                    "--out", str(out), "--quiet"], check=True, timeout=300, capture_output=True)
    return out
