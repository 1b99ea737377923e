"""The `data:` payloads of a server-sent-events response read line by line (clients of the streaming
routes: the soak benchmark and the fault tests)."""

from __future__ import annotations

from typing import Iterable, Iterator

__all__ = ["data_payloads"]


def data_payloads(raw_lines: Iterable[bytes]) -> Iterator[str]:
    """Each `data:` line's payload, stripped, in order (`[DONE]` included); other lines are skipped."""
    for raw in raw_lines:
        line = raw.decode(errors="replace").strip()
        if line.startswith("data:"):
            yield line[5:].strip()
