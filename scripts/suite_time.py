"""Where the suite's time goes, from the JUnit XML that scripts/test.sh writes (test-results/junit.xml).

    .venv/bin/python scripts/suite_time.py [test-results/junit.xml] [--top 25]

Prints the seconds per test module (setup, call and teardown of its cases, as pytest records them per case)
and per top-level folder, the sum over all cases, and the slowest cases. With `-n 2` the wall time is about
half the sum when the two workers are balanced; the sum is what any change of the suite has to shrink.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def case_times(path: Path) -> list[tuple[str, str, float]]:
    """(module file, case name, seconds) for every case of the report."""
    cases = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        cases.append((module, case.get("name", ""), float(case.get("time", 0.0))))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", default="test-results/junit.xml", type=Path)
    parser.add_argument("--top", type=int, default=25, help="how many of the slowest cases to list")
    args = parser.parse_args()
    cases = case_times(args.report)
    by_module: dict[str, float] = collections.Counter()
    by_folder: dict[str, float] = collections.Counter()
    for module, _, seconds in cases:
        by_module[module] += seconds
        by_folder["/".join(module.split("/")[:2])] += seconds
    total = sum(seconds for _, _, seconds in cases)
    print(f"{len(cases)} cases, {total:.0f} s summed over both workers")
    print("\nper folder:")
    for folder, seconds in sorted(by_folder.items(), key=lambda kv: -kv[1]):
        print(f"{seconds:8.1f} s  {folder}")
    print("\nper module:")
    for module, seconds in sorted(by_module.items(), key=lambda kv: -kv[1]):
        print(f"{seconds:8.1f} s  {module}")
    print(f"\nslowest {args.top} cases:")
    for module, name, seconds in sorted(cases, key=lambda c: -c[2])[: args.top]:
        print(f"{seconds:8.1f} s  {module}::{name}")


if __name__ == "__main__":
    main()
