"""W and the window chunk size are written down once: `config.DEFAULT_WINDOW` and
`sched.config.DEFAULT_WINDOW_CHUNK`. Every other default window of the package is one of those names,
never a number (a window constant, a dataclass field, or a `--...window...` flag's default)."""

from __future__ import annotations

import ast
from pathlib import Path

from sglang_asym.config import DEFAULT_WINDOW, V41Config
from sglang_asym.sched.config import DEFAULT_WINDOW_CHUNK, SchedulerConfig
from sglang_asym.split import SplitPlan

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sglang_asym"
HOMES = {("config.py", "DEFAULT_WINDOW"), ("sched/config.py", "DEFAULT_WINDOW_CHUNK")}
# Numbers still written elsewhere, each with why (none today).
KNOWN: set[tuple[str, str]] = set()


def _int(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def literal_windows() -> set[tuple[str, str]]:
    """(file, name) of every window-like name given an integer literal, and of every window flag
    whose default is an integer literal."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and _int(node.value):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and _int(node.value) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                names = [f for f in flags if f.endswith("window")] if _int(default) else []
                names += [f for f in flags if "window-chunk" in f] if _int(default) and default.value else []
            else:
                continue
            for name in names:
                if name.lower() in ("window", "sliding_window", "window_chunk", "default_window",
                                    "default_window_chunk") or name.startswith("--"):
                    found.add((rel, name))
    return found


def test_window_numbers_have_one_home():
    extra = literal_windows() - HOMES - KNOWN
    assert extra == set(), f"write these as config.DEFAULT_WINDOW / sched.config.DEFAULT_WINDOW_CHUNK: {sorted(extra)}"
    assert HOMES <= literal_windows()  # the scan sees the homes themselves


def test_the_defaults_agree():
    assert DEFAULT_WINDOW == 128 and DEFAULT_WINDOW_CHUNK == 32
    assert V41Config().sliding_window == DEFAULT_WINDOW == SchedulerConfig.__dataclass_fields__["window"].default
    assert SplitPlan(V41Config.tiny(), 200).window == DEFAULT_WINDOW
