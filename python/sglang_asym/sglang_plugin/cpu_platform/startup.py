"""Interpreter start-up in SGLang's spawned processes: the CPU import stand-ins, before anything else.

SGLang's spawned scheduler and detokenizer processes unpickle their arguments before they load
plugins, and unpickling imports `sglang.srt.configs`, which reaches torchvision through a multimodal
helper. On a CPU machine no torchvision imports beside the CPU torch, so the stand-in must be in
place at interpreter start. The package installs `sglang_asym_startup.pth` into site-packages (see
setup.py); it calls `run()`, which does nothing unless the launcher turned the CPU engine on for its
children (engine_mode.CHILD_FLAG), so every other Python process pays one environment lookup.
"""

from __future__ import annotations

import os

from .engine_mode import CHILD_FLAG

STARTUP_GAPS = ("torchvision",)  # a vllm stand-in would break SGLang's logger set-up


def run() -> None:
    if os.environ.get(CHILD_FLAG) != "1":
        return
    from . import import_gaps as cpu_import_gaps

    cpu_import_gaps.install(STARTUP_GAPS)
