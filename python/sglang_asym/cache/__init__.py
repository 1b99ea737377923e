"""Per-request cache groups (SWA rows, compressed KV rows, index keys, compressor tails)."""

from .groups import (KIND_FORMATS, ROW_FORMATS, GroupId, GroupKind, cache_group, index_group, kv_group, parse_group,
                     swa_group, tail_group)
from .request import CacheSet, RequestCache
from .rows import GroupRows

__all__ = ["CacheSet", "GroupRows", "RequestCache", "KIND_FORMATS", "ROW_FORMATS", "GroupId", "GroupKind",
           "cache_group", "parse_group", "index_group", "kv_group", "swa_group", "tail_group"]
