"""One entry of a CPU-route patch table (patches.py, deterministic.py): the SGLang symbol, the kind of change,
the process it matters in and why; and the registry look-up every hook table's installer uses (`register_missing`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

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


def register_missing(hooks: Iterable[tuple[str, Callable, str]], apply: bool = False,
                     source: tuple[str, str] | None = None) -> None:
    """Registers each (target, hook, HookType name) not registered yet, so that a second call adds nothing; with
    `apply`, applies the registry when it registered any (SGLang patches a target once: a hook added to a target
    already patched stays unapplied). `source`: the (entry point, distribution) named in SGLang's hook logs."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType

    registered = False
    for target, hook, kind in hooks:
        if not is_registered(target, hook):
            HookRegistry.register(target, hook, HookType[kind], source=HookSource(*source) if source else None)
            registered = True
    if apply and registered:
        HookRegistry.apply_hooks()
