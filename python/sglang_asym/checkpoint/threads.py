"""single_threaded(): one intra-op thread while checkpoint I/O handles thousands of small tensors.

OpenMP fan-out costs more than it saves (an amax over 32K floats takes ~0.4 ms with 2 threads on
a busy 2-core machine and ~0.01 ms with one)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def single_threaded() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
