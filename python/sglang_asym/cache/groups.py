"""Row-group identities as typed values: (kind, layer) <-> the wire name `{kind}.L{layer}`, and the one kind -> format table.

A request's cache (and its payload on the wire) is a set of row groups, one per kind and layer:
  swa.L{i}    layer i's window KV rows                    release format fp8,   v4 row, head_dim channels
  kv.L{o}     KV owner o's compressed main-KV rows        release format nvfp4, v4 row, head_dim channels
  index.L{o}  owner o's index-key rows                    release format mxfp4 (also in v4), index_head_dim channels
  tail.L{o}   ratio-2 owner o's pending token: compressor value and gate, fp32 [2, head_dim], in every format
Row formats: `model` (raw rows in the model dtype), `release` and `v4` (packed as `--cache-quant` of the
same name quantizes them; `v4` is SGLang's V4 pool layout, formats/v4_rows.py).
Names that are not cache groups (aux rows such as `aux.first_token`) have no identity: `cache_group`
returns None for them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

import torch

from ..config import V41Config
from ..formats import CacheFormat

_NAME = re.compile(r"(?P<kind>[a-z_]+)\.L(?P<layer>\d+)")


class GroupKind(str, Enum):
    SWA = "swa"
    KV = "kv"
    INDEX = "index"
    TAIL = "tail"

    @property
    def streams(self) -> bool:
        """kv / index rows are final once their tokens are computed, so a prefill ships them chunk by
        chunk; window rows and tails are final only when the prefix is done."""
        return self in (GroupKind.KV, GroupKind.INDEX)


@dataclass(frozen=True)
class KindFormat:
    """How a kind's rows are stored: the packed format under each packed row format (None: raw fp32)
    and the row's channels."""

    release: str | None
    v4: str | None
    channels_attr: str  # the V41Config field giving a row's channels

    def channels(self, cfg: V41Config) -> int:
        return getattr(cfg, self.channels_attr)

    def packed(self, row_format: str, cfg: V41Config) -> CacheFormat | None:
        """The row codec of a packed row format (`release`, `v4`); None for `model` rows and fp32 tails."""
        if row_format not in ROW_FORMATS:
            raise ValueError(f"row format must be one of {ROW_FORMATS}, got {row_format!r}")
        fmt = None if row_format == "model" else getattr(self, row_format)
        return None if fmt is None else CacheFormat(fmt, rope_channels=cfg.qk_rope_head_dim if fmt == "v4" else 0)


KIND_FORMATS: dict[GroupKind, KindFormat] = {
    GroupKind.SWA: KindFormat("fp8", "v4", "head_dim"),
    GroupKind.KV: KindFormat("nvfp4", "v4", "head_dim"),
    GroupKind.INDEX: KindFormat("mxfp4", "mxfp4", "index_head_dim"),
    GroupKind.TAIL: KindFormat(None, None, "head_dim"),  # value and gate, two fp32 rows of head_dim
}
# wire row formats: the model dtype, or the packed formats of `--cache-quant release` / `v4`
ROW_FORMATS = ("model", "release", "v4")


@dataclass(frozen=True)
class GroupId:
    """One row group: its kind and its layer (the window layer for swa, the KV owner otherwise)."""

    kind: GroupKind
    layer: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", GroupKind(self.kind))
        if type(self.layer) is not int or self.layer < 0:
            raise ValueError(f"a row group's layer must be a non-negative integer, got {self.layer!r}")

    @property
    def name(self) -> str:
        return f"{self.kind.value}.L{self.layer}"

    def __str__(self) -> str:
        return self.name

    @property
    def format(self) -> KindFormat:
        return KIND_FORMATS[self.kind]

    def row_bytes(self, cfg: V41Config, row_format: str, dtype: torch.dtype) -> int:
        """Bytes of one row on the wire: `model` rows in the model dtype, packed rows (`release`, `v4`)
        in their format (tails: fp32)."""
        fmt = self.format
        packed = fmt.packed(row_format, cfg)
        if fmt.release is None:
            return 2 * fmt.channels(cfg) * 4
        if packed is not None:
            return packed.row_bytes(fmt.channels(cfg))
        return fmt.channels(cfg) * torch.empty((), dtype=dtype).element_size()


def cache_group(name: str) -> GroupId | None:
    """The identity of a cache group's name, or None for a name of another shape (aux rows)."""
    m = _NAME.fullmatch(name)
    if m is None or m["kind"] not in GroupKind._value2member_map_:
        return None
    return GroupId(GroupKind(m["kind"]), int(m["layer"]))


def parse_group(name: str) -> GroupId:
    """The identity of a cache group's name (`swa.L3`, `kv.L2`, ...); anything else is refused."""
    group = cache_group(name)
    if group is None:
        raise ValueError(f"{name!r} is not a cache row group (expected one of "
                         f"{[k.value + '.L<layer>' for k in GroupKind]})")
    return group


def row_count(name: str, rows: torch.Tensor) -> int:
    """Rows a group's tensor holds: a tail's [2, head_dim] (value, gate) is one row; names that are not
    cache groups count their first dimension."""
    group = cache_group(name)
    return 1 if group is not None and group.kind is GroupKind.TAIL else rows.shape[0]


def swa_group(layer: int) -> str:
    return GroupId(GroupKind.SWA, layer).name


def kv_group(owner: int) -> str:
    return GroupId(GroupKind.KV, owner).name


def index_group(owner: int) -> str:
    return GroupId(GroupKind.INDEX, owner).name


def tail_group(owner: int) -> str:
    return GroupId(GroupKind.TAIL, owner).name
