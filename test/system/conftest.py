"""The checkpoint every system test module's servers load: the small V4.1 at SGLang's pool geometry, written
once per test session (and per xdist worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .sglang_servers import write_sglang_checkpoint


@pytest.fixture(scope="session")
def sglang_checkpoint(tmp_path_factory) -> Path:
    return write_sglang_checkpoint(tmp_path_factory.mktemp("sglang_ckpt"))
