"""Slot runs: coalescing slot lists into contiguous (start, length) runs, their compact wire
form, and pairing source with destination runs. Runs are int64 arrays of shape (k, 2)."""

from __future__ import annotations

import numpy as np

_WIRE = np.dtype("<i8")


def as_slots(slots, name: str = "slots") -> np.ndarray:
    arr = np.asarray(slots, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _run_bounds(breaks: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(first index, length) of each run, from the indices where a new run begins after 0.
    Plain slicing and ufuncs: np.diff/append/stack cost microseconds each in Python glue."""
    first = np.empty(len(breaks) + 1, dtype=np.int64)
    first[0], first[1:] = 0, breaks
    ends = np.empty_like(first)
    ends[:-1], ends[-1] = breaks, n
    return first, ends - first


def coalesce_slots(slots) -> np.ndarray:
    """Runs covering `slots` in order; a run continues while slots step by +1."""
    slots = as_slots(slots)
    if len(slots) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    first, lengths = _run_bounds(np.flatnonzero(slots[1:] != slots[:-1] + 1) + 1, len(slots))
    runs = np.empty((len(first), 2), dtype=np.int64)
    runs[:, 0], runs[:, 1] = slots[first], lengths
    return runs


def _check_runs(runs) -> np.ndarray:
    runs = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
    starts, lengths = runs[:, 0], runs[:, 1]
    if len(runs) and (int(starts.min()) < 0 or int(lengths.min()) <= 0):
        bad = int(np.flatnonzero((starts < 0) | (lengths <= 0))[0])
        raise ValueError(f"invalid slot run (start={int(starts[bad])}, length={int(lengths[bad])})")
    return runs


def run_rows(runs) -> int:
    """Rows the runs cover, counted without overflow (runs off the wire may claim up to 2^63 rows each),
    so a caller can refuse a count before `expand_runs` allocates it."""
    return sum(int(n) for n in _check_runs(runs)[:, 1])


def expand_runs(runs) -> np.ndarray:
    """Inverse of `coalesce_slots`."""
    runs = _check_runs(runs)
    starts, lengths = runs[:, 0], runs[:, 1]
    offsets = np.cumsum(lengths) - lengths  # first row index of every run
    return np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def pack_runs(runs) -> bytes:
    return np.asarray(runs, dtype=_WIRE).reshape(-1, 2).tobytes()


def unpack_runs(data: bytes) -> np.ndarray:
    if len(data) % (2 * _WIRE.itemsize):
        raise ValueError(f"packed slot runs must be a multiple of 16 bytes, got {len(data)}")
    return np.frombuffer(data, dtype=_WIRE).reshape(-1, 2).astype(np.int64)


def paired_runs(src, dst) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split row i -> (src[i], dst[i]) into maximal runs contiguous on BOTH sides.

    Returns (src_starts, dst_starts, row_counts), one entry per run.
    """
    src, dst = as_slots(src, "source slots"), as_slots(dst, "destination slots")
    if len(src) != len(dst):
        raise ValueError(f"{len(src)} source slots but {len(dst)} destination slots")
    if len(src) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    breaks = np.flatnonzero((src[1:] != src[:-1] + 1) | (dst[1:] != dst[:-1] + 1)) + 1
    first, counts = _run_bounds(breaks, len(src))
    return src[first], dst[first], counts
