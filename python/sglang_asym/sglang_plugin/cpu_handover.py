"""On CPU, a DeepSeek-V4.1 server is run by sglang-asym's embedded runtime, not by SGLang.

SGLang 0.5.23 cannot serve V4.1 on CPU (its V4 KV-store and mHC kernels are Triton/CUDA only, and
its CPU engine needs an sgl-kernel CPU build that PyPI does not ship). So when the server would run
on CPU, `sglang.launch_server` / `sglang serve` hand the unchanged command line to
`sglang_asym.launch_server.main(argv)`, which takes the same flags:
- every asymmetric mode (asym-prefill / asym-decode);
- null / prefill / decode too when the checkpoint is DeepSeek-V4.1 (other models stay with SGLang).
"Would run on CPU": `--device cpu`, or no `--device` on a machine without CUDA.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NoReturn, Sequence

from ..config import ConfigError, V41Config
from .settings import settings_of

LAUNCHER_MODULE = "sglang_asym.launch_server"


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
    if not runs_on_cpu(server_args.device):
        return False
    return settings_of(server_args) is not None or is_v41_checkpoint(server_args.model_path)


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
