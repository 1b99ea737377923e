"""Whether this process runs SGLang's own engine on CPU through sglang-asym's platform (no SGLang import).

The answer must be the same in the launcher and in every process SGLang spawns, and cheap enough for
interpreter start-up (startup.py asks it): `SGLANG_PLATFORM` naming the platform selects it; any other
`SGLANG_PLATFORM` declines; unset, it is selected where torch sees no CUDA device.
"""

from __future__ import annotations

import os

PLATFORM_NAME = "sglang_asym"  # the entry-point name in group sglang.srt.platforms (as the plugin: one SGLANG_PLUGINS name allows both)
# Set by the launcher for its children: the CPU engine is on (interpreter start reads only this).
CHILD_FLAG = "SGLANG_ASYM_CPU_ENGINE"


def cpu_engine_selected() -> bool:
    chosen = os.environ.get("SGLANG_PLATFORM", "").strip()
    if chosen:
        return chosen == PLATFORM_NAME
    if os.environ.get(CHILD_FLAG) == "1":
        return True
    import torch

    return not torch.cuda.is_available()
