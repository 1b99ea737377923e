"""docs/structures.md maps every module in one line and is current."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_structures_md_is_current():
    expected = subprocess.run([sys.executable, str(ROOT / "scripts" / "structures.py")], capture_output=True,
                              text=True, check=True).stdout
    current = (ROOT / "docs" / "structures.md").read_text()
    assert current == expected, "docs/structures.md is stale: run `python scripts/structures.py > docs/structures.md`"


def test_every_package_module_has_a_docstring():
    missing = [str(p.relative_to(ROOT)) for p in (ROOT / "python").rglob("*.py")
               if "__pycache__" not in p.parts and not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []
