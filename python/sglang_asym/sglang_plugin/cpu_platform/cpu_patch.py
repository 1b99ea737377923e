"""One entry of a CPU-route patch table (patches.py, deterministic.py): the SGLang symbol, the kind of change,
the process it matters in and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

LAUNCHER, SCHEDULER = "launcher", "scheduler"


@dataclass(frozen=True)
class CpuPatch:
    target: str  # dotted path of the SGLang symbol
    kind: str  # AROUND / REPLACE (HookRegistry) or ATTRIBUTE (a class attribute set directly)
    hook: Callable | Any
    why: str
    process: str = SCHEDULER


def is_registered(target: str, hook: Any) -> bool:
    """Whether `hook` itself is registered on `target` (other hooks may share the target)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    return any(h is hook for _, h, _ in HookRegistry._hooks.get(target, ()))
