"""On CPU, an asymmetric server can be handed to sglang-asym's embedded runtime instead of SGLang's engine.

SGLang's own engine serves DeepSeek-V4.1 on CPU through sglang-asym's platform (cpu_platform.py) in
every mode, the asymmetric ones included (asym_decode.py, prefill_cut.py). With
SGLANG_ASYM_CPU_RUNTIME=embedded, an asymmetric server that would run on CPU is run by the embedded
runtime instead: `sglang.launch_server` / `sglang serve` hand the unchanged command line to
`sglang_asym.launch_server.main(argv)`, which takes the same flags (a way to compare both stacks
under one command line). "Would run on CPU": `--device cpu`, or no `--device` on a machine without CUDA.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, NoReturn, Sequence

from ..config import ConfigError, V41Config
from .settings import settings_of

LAUNCHER_MODULE = "sglang_asym.launch_server"
RUNTIME_ENV = "SGLANG_ASYM_CPU_RUNTIME"
EMBEDDED = "embedded"


class CpuHandoverError(RuntimeError):
    """The embedded runtime that a CPU server hands over to cannot be started."""


def runs_on_cpu(device: str | None) -> bool:
    if device is not None:
        return str(device).split(":", 1)[0] == "cpu"
    import torch

    return not torch.cuda.is_available()


def is_v41_checkpoint(model_path: str | None) -> bool:
    if not model_path:
        return False
    try:
        V41Config.from_json_file(model_path)
    except ConfigError:
        return False
    return True


def should_hand_over(server_args: Any) -> bool:
    """Whether this parsed SGLang server belongs to the embedded runtime (see module doc)."""
    if os.environ.get(RUNTIME_ENV, "") != EMBEDDED:
        return False
    return runs_on_cpu(server_args.device) and settings_of(server_args) is not None


def _embedded_launcher() -> Callable[[list[str]], Any]:
    try:
        module = importlib.import_module(LAUNCHER_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != LAUNCHER_MODULE:
            raise
        raise CpuHandoverError(
            f"this server runs on CPU and hands over to sglang-asym's embedded runtime, "
            f"but {LAUNCHER_MODULE} is not installed"
        ) from None
    return module.main


def hand_over(argv: Sequence[str], launch: Callable[[list[str]], Any] | None = None) -> NoReturn:
    """Runs the embedded runtime with the unchanged command line and exits with its status."""
    launch = launch or _embedded_launcher()
    raise SystemExit(launch(list(argv)))
