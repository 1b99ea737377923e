"""Payload manifest: what crosses the wire from the prefill role to the decode role.

A payload is a set of named row groups. Each group is a table of fixed-size rows
(one row per token, per token pair, or per tail slot); the manifest says how many
rows of each group a request ships and how many bytes one row takes in the chosen
row format. SplitPlan produces manifests; the transfer layer moves them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowGroup:
    """One cache group of a request's payload: `num_rows` rows of `row_bytes` bytes."""

    name: str
    row_bytes: int
    num_rows: int

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("RowGroup needs a name")
        if self.row_bytes <= 0:
            raise ValueError(f"RowGroup {self.name!r}: row_bytes must be positive, got {self.row_bytes}")
        if self.num_rows < 0:
            raise ValueError(f"RowGroup {self.name!r}: num_rows must be >= 0, got {self.num_rows}")

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.num_rows


@dataclass(frozen=True)
class PayloadManifest:
    """The ordered row groups of one request's prefix payload (empty when N <= W)."""

    groups: tuple[RowGroup, ...]

    def __post_init__(self) -> None:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate row group names in manifest: {names}")

    @property
    def total_bytes(self) -> int:
        return sum(g.nbytes for g in self.groups)

    @property
    def total_rows(self) -> int:
        return sum(g.num_rows for g in self.groups)

    def group(self, name: str) -> RowGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no row group {name!r} in manifest (have {[g.name for g in self.groups]})")

    def nonempty(self) -> "PayloadManifest":
        return PayloadManifest(tuple(g for g in self.groups if g.num_rows > 0))
