"""What P and D must agree on before a single byte moves.

Both workers build a `TransferCompat` from their own configuration; the handshake carries
D's and P's copies and either side refuses the request if any field differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_asym.manifest import PayloadManifest

SEMANTICS = ("exact", "decoder-replay", "asym", "asym-exact-encoder")


@dataclass(frozen=True)
class RowFormat:
    """The byte layout of one row group: `row_bytes` bytes encoded as `encoding`."""

    group: str
    row_bytes: int
    encoding: str

    def __post_init__(self) -> None:
        if not self.group or not self.encoding:
            raise ValueError(f"RowFormat needs a group and an encoding, got {self!r}")
        if self.row_bytes <= 0:
            raise ValueError(f"RowFormat {self.group!r}: row_bytes must be positive, got {self.row_bytes}")


@dataclass(frozen=True)
class TransferCompat:
    model_config_hash: str
    row_formats: tuple[RowFormat, ...]
    page_size: int
    window: int
    semantics: str

    def __post_init__(self) -> None:
        if not self.model_config_hash:
            raise ValueError("TransferCompat.model_config_hash must not be empty")
        names = [f.group for f in self.row_formats]
        if len(set(names)) != len(names):
            raise ValueError(f"TransferCompat: duplicate row format groups {names}")
        if self.page_size <= 0 or self.window <= 0:
            raise ValueError(f"TransferCompat: page_size and window must be positive, got "
                             f"page_size={self.page_size} window={self.window}")
        if self.semantics not in SEMANTICS:
            raise ValueError(f"TransferCompat.semantics must be one of {SEMANTICS}, got {self.semantics!r}")

    def row_format(self, group: str) -> RowFormat:
        for fmt in self.row_formats:
            if fmt.group == group:
                return fmt
        raise KeyError(f"no row format for group {group!r} (have {[f.group for f in self.row_formats]})")

    def mismatch(self, other: "TransferCompat") -> str | None:
        """A readable list of the differences (`None` when compatible)."""
        diffs = [f"{name}: {getattr(self, name)!r} != {getattr(other, name)!r}"
                 for name in ("model_config_hash", "page_size", "window", "semantics")
                 if getattr(self, name) != getattr(other, name)]
        mine = {f.group: f for f in self.row_formats}
        theirs = {f.group: f for f in other.row_formats}
        for group in sorted(mine.keys() | theirs.keys()):
            a, b = mine.get(group), theirs.get(group)
            if a != b:
                describe = lambda f: "missing" if f is None else f"{f.row_bytes} B {f.encoding}"  # noqa: E731
                diffs.append(f"row format {group!r}: {describe(a)} != {describe(b)}")
        return "; ".join(diffs) if diffs else None

    def check_manifest(self, manifest: PayloadManifest) -> None:
        """Every group of the manifest must have a row format with the same row size."""
        for group in manifest.groups:
            try:
                fmt = self.row_format(group.name)
            except KeyError as exc:
                raise ValueError(f"manifest group {group.name!r} has no row format in the compat") from exc
            if fmt.row_bytes != group.row_bytes:
                raise ValueError(f"manifest group {group.name!r} has {group.row_bytes} B rows, "
                                 f"its row format says {fmt.row_bytes} B")
