"""Shared fixtures: tiny checkpoints written once per test session (they take well under a second)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_asym.checkpoint import write_checkpoint
from sglang_asym.config import V41Config

from .ckpt_testlib import SEED


@pytest.fixture(scope="session")
def tiny_cfg() -> V41Config:
    return V41Config.tiny()


@pytest.fixture(scope="session")
def tiny_release_sharded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_release_sharded")
    write_checkpoint(out, V41Config.tiny(), SEED, precision="release", num_shards=5, progress=False)
    return out
