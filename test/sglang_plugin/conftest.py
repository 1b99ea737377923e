"""Fixtures for the SGLang plugin tests: checkpoint directories and SGLang's real server parser."""

from __future__ import annotations

import argparse
import atexit
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_asym.config import V41Config

from .script_runs import ForkRunner, python_env

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def v41_checkpoint(tmp_path_factory) -> Path:
    """A directory whose config.json is a DeepSeek-V4.1 text config SGLang's pool can hold (sglang-small)."""
    path = tmp_path_factory.mktemp("v41_ckpt")
    V41Config.sglang_small().write_json(path)
    return path


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("llama_ckpt")
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    return path


@pytest.fixture
def server_parser() -> argparse.ArgumentParser:
    """SGLang 0.5.23's own server parser, extended the way the plugin's AFTER hook extends it."""
    from sglang.srt.server_args import ServerArgs

    from sglang_asym.sglang_plugin.shared.cli import extend_parser

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    extend_parser(parser)
    return parser


FORK_RUNNER = ForkRunner(REPO)  # one per test process (each xdist worker has its own)
atexit.register(FORK_RUNNER.close)


def run_python(args: list[str], timeout: float = 240, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs the project's Python in a process of its own with only this plugin allowed: a helper script or `-m
    module` through the fork runner (script_runs.py); `-c` code, or anything that needs `extra_env`, as a fresh
    process."""
    if (args[0].endswith(".py") or args[0] == "-m") and not extra_env:
        return FORK_RUNNER.run(args, timeout)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env=python_env(extra_env), cwd=REPO)
