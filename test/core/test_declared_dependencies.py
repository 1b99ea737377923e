"""Every third-party module the shipped code imports is declared by its distribution's pyproject.toml.

Read statically (ast, no imports): every `import x` / `from x import y` under python/ (the sglang-asym
distribution), at any depth, including imports inside functions. A module
is first-party when a distribution of this repository provides it, and skipped when it is in the
standard library or on ALLOWED_UNDECLARED; every other one must map to a distribution named in the core
dependencies or in one of the extras. Module names map to distributions through
importlib.metadata.packages_distributions() and DISTRIBUTIONS_OF (names that differ, or that have more
than one build).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Distribution:
    source: Path  # the folder its modules live in
    pyproject: Path


SHIPPED = (
    Distribution(ROOT / "python", ROOT / "pyproject.toml"),
)

# Import names whose distribution is named differently, or is published in several builds (any one of
# them declared is enough). packages_distributions() only knows what is installed in this interpreter.
DISTRIBUTIONS_OF: dict[str, tuple[str, ...]] = {
    "zmq": ("pyzmq",),
    "prometheus_client": ("prometheus-client",),
    # one module, three builds: CUDA 12, CUDA 13 (the gpu extra), no CUDA (the cpu extra)
    "mooncake": ("mooncake-transfer-engine", "mooncake-transfer-engine-cuda13", "mooncake-transfer-engine-non-cuda"),
}

# Third-party modules imported without a declaration, each with why. SGLang's own optional imports go
# here when the code reaches them directly (SGLang's modules reaching them are SGLang's business);
# the CPU route's import stand-ins (torchvision, vllm) are installed by name, not imported. Empty today.
ALLOWED_UNDECLARED: dict[str, str] = {}


def normalize(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def top_level_imports(source: str) -> set[str]:
    """The top-level module names a source file imports, at any depth; relative imports are the file's own package."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def imports_under(folder: Path) -> dict[str, set[str]]:
    """Top-level module name -> the files under `folder` that import it (setup.py, a build script, is left out)."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts or path.name == "setup.py":
            continue
        for name in top_level_imports(path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def first_party_modules() -> set[str]:
    """Top-level packages and modules the repository's own distributions provide."""
    names = set()
    for dist in SHIPPED:
        for entry in dist.source.iterdir():
            if entry.is_dir() and (entry / "__init__.py").exists():
                names.add(entry.name)
            elif entry.suffix == ".py" and entry.name != "setup.py":
                names.add(entry.stem)
    return names


def requirement_name(requirement: str) -> tuple[str, tuple[str, ...]]:
    """(normalized distribution name, extras) of a PEP 508 requirement string."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", requirement)
    assert match, f"not a requirement: {requirement!r}"
    extras = tuple(e.strip() for e in (match.group(2) or "").split(",") if e.strip())
    return normalize(match.group(1)), extras


def declared_distributions(pyproject: dict) -> set[str]:
    """Distributions named by the core dependencies or any extra (an extra naming the project's own extras included)."""
    project = pyproject["project"]
    own = normalize(project["name"])
    groups = [project.get("dependencies", [])] + list(project.get("optional-dependencies", {}).values())
    names = {requirement_name(r)[0] for group in groups for r in group}
    names.discard(own)
    return names


def distributions_of(module: str, installed: dict[str, list[str]]) -> set[str]:
    names = set(DISTRIBUTIONS_OF.get(module, ())) | set(installed.get(module, ())) | {module}
    return {normalize(n) for n in names}


def undeclared(found: dict[str, set[str]], declared: set[str], first_party: set[str],
               installed: dict[str, list[str]]) -> dict[str, list[str]]:
    """Third-party modules none of whose distributions is declared -> the files importing them."""
    missing = {}
    for module, files in found.items():
        if module in sys.stdlib_module_names or module in first_party or module in ALLOWED_UNDECLARED:
            continue
        if not distributions_of(module, installed) & declared:
            missing[module] = sorted(files)
    return missing


def load(path: Path) -> dict:
    with path.open("rb") as f:
        return tomllib.load(f)


def test_every_imported_third_party_module_is_declared():
    installed = importlib.metadata.packages_distributions()
    first_party = first_party_modules()
    scanned = 0
    for dist in SHIPPED:
        found = imports_under(dist.source)
        scanned += len(found)
        missing = undeclared(found, declared_distributions(load(dist.pyproject)), first_party, installed)
        assert missing == {}, f"{dist.pyproject.relative_to(ROOT)} does not declare what these files import: {missing}"
    assert scanned > 20  # the scan read the sources; an empty scan would prove nothing


def test_the_scan_reports_a_missing_declaration():
    found = {"numpy": {"a.py"}, "zmq": {"b.py"}, "yaml": {"c.py", "d.py"}, "os": {"a.py"}, "sglang_asym": {"e.py"}}
    declared = {"numpy", "pyzmq"}
    assert undeclared(found, declared, {"sglang_asym"}, {}) == {"yaml": ["c.py", "d.py"]}
    assert undeclared(found, declared | {"pyyaml"}, {"sglang_asym"}, {"yaml": ["PyYAML"]}) == {}


def test_the_real_declaration_minus_one_distribution_fails():
    installed = importlib.metadata.packages_distributions()
    declared = declared_distributions(load(ROOT / "pyproject.toml"))
    found = imports_under(ROOT / "python")
    assert undeclared(found, declared - {"tqdm"}, first_party_modules(), installed).keys() == {"tqdm"}
    # either Mooncake build declares the module; with none of them it is missing
    builds = {normalize(n) for n in DISTRIBUTIONS_OF["mooncake"]}
    scan = {"mooncake": {"x.py"}}
    assert undeclared(scan, declared, set(), installed) == {}
    assert undeclared(scan, declared - builds, set(), installed) == {"mooncake": ["x.py"]}


def test_imports_are_read_at_any_depth():
    source = (
        "import os.path\nfrom zmq.asyncio import Context\nfrom . import sibling\nfrom .pkg import x\n"
        "def f():\n    import yaml\n    class C:\n        from tqdm import tqdm\n"
        "try:\n    import crc32c\nexcept ImportError:\n    pass\n"
    )
    assert top_level_imports(source) == {"os", "zmq", "yaml", "tqdm", "crc32c"}


def test_requirement_names_are_normalized():
    assert requirement_name("prometheus_client>=0.20,<1") == ("prometheus-client", ())
    assert requirement_name("sglang-asym[plan, test]") == ("sglang-asym", ("plan", "test"))
    assert requirement_name("Jinja2 ; python_version >= '3.11'") == ("jinja2", ())


def test_the_two_routes_get_their_own_builds():
    """The gpu extra installs SGLang with its CUDA stack and Mooncake's CUDA build; the cpu extra keeps
    torch's 2.13.0 CPU build (as constraints-sglang.txt does) and Mooncake's non-CUDA build; the core
    dependencies pin no exact torch, so both routes resolve."""
    project = load(ROOT / "pyproject.toml")["project"]
    extras = project["optional-dependencies"]
    gpu, cpu = set(extras["gpu"]), set(extras["cpu"])
    assert {"sglang==0.5.23", "mooncake-transfer-engine-cuda13==0.3.13.post1", "sglang-router==0.3.2", "smg==1.13.0"} <= gpu
    assert not any("non-cuda" in r for r in gpu)
    assert {"torch==2.13.0", "mooncake-transfer-engine-non-cuda==0.3.13.post1", "sglang-router==0.3.2", "smg==1.13.0"} <= cpu
    assert not any(requirement_name(r)[0] == "sglang" for r in cpu)  # SGLang goes in with --no-deps on CPU
    torch = [r for r in project["dependencies"] if requirement_name(r)[0] == "torch"]
    assert torch == ["torch>=2.13,<2.15"]
    constraints = (ROOT / "constraints-sglang.txt").read_text().splitlines()
    assert "torch==2.13.0" in constraints
    pin = re.search(r"^SGLANG_PIN=(\S+)$", (ROOT / "scripts" / "setup_sglang.sh").read_text(), re.M)
    assert pin and pin.group(1) in gpu
