"""The documents resolve: every path docs/architecture.md names exists (and every `file.py::Name` it
names is defined there), and every document the code cites is a file of the repository.

Paths on docs/architecture.md are relative to the repository root when they start with one of its
top-level directories, else to python/sglang_asym/ (the page states that convention)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "sglang_asym"
DOC = ROOT / "docs" / "architecture.md"
FILE_SUFFIXES = (".py", ".md", ".json", ".sh", ".toml", ".txt")
# Where code cites documents: every source file of the repository (generated results are not code).
CODE_AREAS = ("python", "scripts", "benchmark", "test", ".ci", ".github")
CODE_SUFFIXES = (".py", ".sh", ".toml", ".yml", ".yaml", ".cfg")
MD_REF = re.compile(r"(?<![\w./-])((?:\.\./|[\w-]+/)*[\w-]+\.md)\b")
BARE_PROSE_REF = re.compile(r"(?<![\w./'\"-])([\w-]+\.md)\b")  # a bare name in prose, not a quoted path part


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\s]+)`", text)


def resolve(path: str) -> Path | None:
    """The repository file or folder a path on the page names, or None."""
    for base in (ROOT, PACKAGE):
        candidate = base / path
        if candidate.exists():
            return candidate
    return None


def names_a_path(token: str) -> bool:
    plain = token.split("::")[0]
    return "/" in plain or plain.endswith(FILE_SUFFIXES)


def defines(path: Path, qualname: str) -> bool:
    """Whether `path` defines `qualname` (a function, class, method or module-level name)."""
    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    for part in qualname.split("."):
        match = None
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == part:
                match = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    match = node
        if match is None:
            return False
        scope = getattr(match, "body", [])
    return True


def test_every_path_on_the_architecture_page_exists():
    tokens = [t for t in backticked(DOC.read_text()) if names_a_path(t)]
    assert len(tokens) > 50  # the page names its files; an empty scan would prove nothing
    missing = sorted({t for t in tokens if resolve(t.split("::")[0].rstrip("/")) is None})
    assert missing == [], f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_function_on_the_architecture_page_is_defined_where_it_says():
    hops = sorted({t for t in backticked(DOC.read_text()) if "::" in t})
    assert len(hops) > 30  # the page names the request path hop by hop (the SGLang path alone since the embedded one retired)
    wrong = [t for t in hops if t != "::" and ((p := resolve(t.split("::")[0])) is None or not p.is_file()
                                            or not defines(p, t.split("::")[1]))]
    assert wrong == [], f"docs/architecture.md names functions that are not defined there: {wrong}"


def test_defines_reads_nested_names():
    path = PACKAGE / "model" / "model.py"
    assert defines(path, "V41Model.forward_batch") and defines(path, "SegmentInput")
    assert not defines(path, "V41Model.no_such_method") and not defines(path, "NoSuchClass")


def cited_documents(pattern: re.Pattern = MD_REF) -> dict[str, list[str]]:
    """Each .md path cited in the code -> the files citing it."""
    cited: dict[str, list[str]] = {}
    for area in CODE_AREAS:
        for path in (ROOT / area).rglob("*"):
            if not path.is_file() or path.suffix not in CODE_SUFFIXES or "__pycache__" in path.parts:
                continue
            for ref in pattern.findall(path.read_text(errors="replace")):
                cited.setdefault(ref, []).append(path.relative_to(ROOT).as_posix())
    return cited


def document_exists(ref: str) -> bool:
    """A cited .md: a path from the repository root, or a bare name of a file in docs/, in
    benchmark/results/ (written by the benchmarks) or at the root."""
    if "/" in ref:
        return (ROOT / ref).is_file()
    return any((ROOT / where / ref).is_file() for where in ("docs", "benchmark/results", "."))


def test_every_document_the_code_cites_exists():
    cited = cited_documents()
    assert "docs/structures.md" in cited and "docs/v41-model.md" in cited  # the scan finds citations
    missing = {ref: files for ref, files in cited.items() if not document_exists(ref)}
    assert missing == {}, f"documents cited by the code that are not in the repository: {missing}"


def test_design_documents_are_cited_from_docs():
    """A design document is cited by its place in docs/, so a reader can open it (a quoted name joined
    to a path, as in `ROOT / "docs" / name`, is not a citation)."""
    design = {p.name for p in (ROOT / "docs").glob("*.md")}
    bare = {ref: files for ref, files in cited_documents(BARE_PROSE_REF).items() if ref in design}
    assert bare == {}, f"cite these as docs/<name>.md: {bare}"
