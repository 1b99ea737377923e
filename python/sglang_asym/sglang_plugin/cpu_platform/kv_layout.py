"""The DeepSeek-V4 pool layout SGLang's engine on CPU builds: SGLANG_DSV4_KV_LAYOUT=v41 or v4, `auto` (the
default) taking v41, what SGLang picks on a B300 (SM103). Read by the pool's layout patch (patches.py) and by
the reference layers, whose caches are quantized as the pool stores its rows."""

from __future__ import annotations

import os

KV_LAYOUT_ENV = "SGLANG_DSV4_KV_LAYOUT"
CPU_KV_LAYOUTS = ("v41", "v4")  # the first is what `auto` picks


class CpuLayoutError(ValueError):
    """SGLANG_DSV4_KV_LAYOUT names a layout the CPU engine cannot serve."""


def cpu_kv_layout_name() -> str:
    chosen = os.environ.get(KV_LAYOUT_ENV, "auto").strip().lower() or "auto"
    if chosen == "auto":
        return CPU_KV_LAYOUTS[0]
    if chosen not in CPU_KV_LAYOUTS:
        raise CpuLayoutError(f"{KV_LAYOUT_ENV}={chosen!r}: the CPU engine serves {' or '.join(CPU_KV_LAYOUTS)} "
                             "(or auto, which picks v41 as SGLang does on a B300)")
    return chosen
