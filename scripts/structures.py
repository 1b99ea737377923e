#!/usr/bin/env python3
"""Print one line per module (path: first docstring line) for docs/structures.md.

    python scripts/structures.py > docs/structures.md
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AREAS = ("python", "scripts", "benchmark", "test")


def first_line(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except SyntaxError:
        doc = None
    return (doc or "").strip().splitlines()[0] if doc else ""


def main() -> int:
    print("# Module map\n")
    print("One line per module: `path`: what it is for (its docstring's first line).")
    print("Regenerate with `python scripts/structures.py > docs/structures.md`; a test checks it is current.\n")
    for area in AREAS:
        files = sorted(p for p in (ROOT / area).rglob("*.py")
                       if "__pycache__" not in p.parts and not (p.name == "__init__.py" and not p.read_text().strip()))
        if not files:
            continue
        print(f"\n## {area}/\n")
        for path in files:
            rel = path.relative_to(ROOT).as_posix()
            print(f"- `{rel}`: {first_line(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
