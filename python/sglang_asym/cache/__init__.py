"""Paged per-request cache groups (SWA rows, compressed KV rows, index keys, compressor tails)."""

from .groups import (KIND_FORMATS, ROW_FORMATS, GroupId, GroupKind, cache_group, index_group, kv_group, parse_group,
                     swa_group, tail_group)
from .paged import OutOfPages, PagedPool, PagedRows, PoolSpec
from .request import CacheSet, CacheSizing, RequestCache

__all__ = ["OutOfPages", "PagedPool", "PagedRows", "PoolSpec", "CacheSet", "CacheSizing", "RequestCache",
           "KIND_FORMATS", "ROW_FORMATS", "GroupId", "GroupKind", "cache_group", "parse_group",
           "index_group", "kv_group", "swa_group", "tail_group"]
