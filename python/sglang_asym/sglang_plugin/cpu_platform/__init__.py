"""The CPU route: SGLang's own engine on a CPU machine, as an out-of-tree SGLang platform (platform.py), the
patches SGLang needs there (patches.py) and the project's reference model computing SGLang's layers over its pool.

This package imports no SGLang: interpreter start-up (startup.py) and SGLang's platform resolution load it."""

from .engine_mode import cpu_engine_selected

QUALNAME = f"{__name__}.platform.AsymCpuPlatform"


def activate() -> str | None:
    """SGLang's platform-plugin entry point (group `sglang.srt.platforms`): this platform's class on a machine
    without CUDA."""
    return QUALNAME if cpu_engine_selected() else None
