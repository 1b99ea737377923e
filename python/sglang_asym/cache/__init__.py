"""Paged per-request cache groups (SWA rows, compressed KV rows, index keys, compressor tails)."""

from .paged import OutOfPages, PagedPool, PagedRows, PoolSpec
from .request import (CacheSet, CacheSizing, RequestCache, index_group, kv_group, swa_group,
                      tail_group)

__all__ = ["OutOfPages", "PagedPool", "PagedRows", "PoolSpec", "CacheSet", "CacheSizing", "RequestCache",
           "index_group", "kv_group", "swa_group", "tail_group"]
