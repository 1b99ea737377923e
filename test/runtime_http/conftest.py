"""Fixtures: a tiny byte-level BPE checkpoint, and fronts served from one background loop per module."""

from __future__ import annotations

import pytest

from sglang_asym.runtime.engine_api import EngineRole
from sglang_asym.runtime.http import HttpServerConfig, TextTokenizer

from .fakes import FakeEngine, write_tiny_checkpoint
from .harness import LoopThread


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_checkpoint"))


@pytest.fixture(scope="session")
def tokenizer(checkpoint_dir) -> TextTokenizer:
    return TextTokenizer.from_dir(checkpoint_dir)


@pytest.fixture(scope="module")
def loop_thread():
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture
def serve(loop_thread, tokenizer, checkpoint_dir):
    """serve(role=..., **FakeEngine kwargs) -> ServedFront on a free port; stopped after the test."""
    fronts = []

    def start(role: EngineRole = EngineRole.COLOCATED, served_model_name: str = "tiny", **engine_kwargs):
        engine = FakeEngine(tokenizer, role, name=served_model_name, **engine_kwargs)
        config = HttpServerConfig(model_path=str(checkpoint_dir), served_model_name=served_model_name, port=0,
                                  health_generate_timeout_s=2.0)
        front = loop_thread.serve(engine, tokenizer, config)
        fronts.append(front)
        return front

    yield start
    for front in fronts:
        loop_thread.call(front.server.stop())
