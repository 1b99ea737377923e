"""Resident memory of a server's process tree (SGLang runs its model in a scheduler process beside the launcher
and the detokenizer), sampled in a background thread so a benchmark reads the peak a request reached."""

from __future__ import annotations

import threading
from pathlib import Path


def process_tree(pid: int) -> list[int]:
    """pid and every descendant (/proc/<pid>/task/<tid>/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(k) for k in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def tree_rss_mb(pid: int) -> float:
    """VmRSS of every process of the tree, summed, in MiB (0 for processes gone meanwhile)."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1024


class PeakRss:
    """`with PeakRss({name: pid}) as peak:` samples every tree each `interval_s`; afterwards `peak.mb[name]` is the
    largest sum seen (first sample at entry, last at exit)."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.25) -> None:
        self.pids, self.interval_s = pids, interval_s
        self.mb = {name: 0.0 for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            self.mb[name] = max(self.mb[name], tree_rss_mb(pid))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "PeakRss":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
