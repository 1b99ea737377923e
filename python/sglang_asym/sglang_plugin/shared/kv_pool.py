"""SGLang's DeepSeekV4TokenToKVPool for a V4.1 config, built on CPU, and the buffer layout its PD
transfer registers (what a peer must match byte for byte).

SGLang registers three lists of (pointer, length, item length) per pool, in a fixed order:
  contiguous     compressed KV and index keys, one buffer per KV source layer; an item is one
                 FULL page (page_size tokens) worth of rows of that buffer
  state          the SWA cache, one buffer per layer; an item is one SWA page
  request_state  the ratio-2 pending-pair rings (compressor tails), one per ratio-2 source
`pool_buffer_layout` names each buffer and gives its bytes per row. Needs `sglang_cpu_context()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...config import V41Config

PAGE_SIZE = 256  # SGLang asserts 256-token pages for the DeepSeek-V4 family
# SGLang's main KV layout -> the model's packed row format (cache/groups.py) and `--cache-quant` mode that
# its pool holds byte for byte: V4.1's own formats in a v41 pool, SGLang's V4 row in a v4 pool
ROW_FORMAT_OF_LAYOUT = {"v41": "release", "v4": "v4"}


def row_format_of_layout(layout: str) -> str:
    try:
        return ROW_FORMAT_OF_LAYOUT[layout]
    except KeyError:
        raise ValueError(f"the reference model's rows fit SGLang's {' / '.join(ROW_FORMAT_OF_LAYOUT)} pool layouts, "
                         f"not {layout!r}") from None


def pool_row_format(pool: Any) -> str:
    """The packed row format a DeepSeekV4TokenToKVPool holds (by its main KV layout)."""
    return row_format_of_layout(pool.swa_kv_pool.kv_layout.value)


@dataclass(frozen=True)
class PoolBuffer:
    name: str  # e.g. "kv.c1.L20", "index.c2.L8", "swa.L0", "pair_ring.L2"
    item_bytes: int  # bytes of one transfer item
    rows_per_item: int  # token rows (or index slots, or ring tokens) in one item
    num_items: int  # items the buffer holds

    @property
    def row_bytes(self) -> int:
        return self.item_bytes // self.rows_per_item


@dataclass(frozen=True)
class PoolLayout:
    pd_kv_layout: str
    contiguous: tuple[PoolBuffer, ...]
    state: tuple[PoolBuffer, ...]
    request_state: tuple[PoolBuffer, ...]


def build_kv_pool(cfg: V41Config, full_tokens: int = 4096, swa_tokens: int = 2048, max_reqs: int = 4,
                  kv_layout: str = "v41") -> Any:
    """A small DeepSeekV4TokenToKVPool on CPU with the arguments SGLang's KV-cache configurator
    passes for a V4.1 target model (fp8 KV cache, fp32 compressor state, 256-token pages)."""
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool, KVLayout

    return DeepSeekV4TokenToKVPool(
        max_num_reqs=max_reqs,
        swa_size=swa_tokens,
        c4_size=0,
        c128_size=0,
        c4_state_pool_size=0,
        c128_state_pool_size=0,
        page_size=PAGE_SIZE,
        swa_page_size=PAGE_SIZE,
        dtype=torch.float8_e4m3fn,
        c4_state_dtype=torch.float32,
        c128_state_dtype=torch.float32,
        qk_nope_head_dim=cfg.head_dim - cfg.qk_rope_head_dim,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        indexer_head_dim=cfg.index_head_dim,
        layer_num=cfg.num_hidden_layers,
        device="cpu",
        enable_memory_saver=False,
        compression_ratios=list(cfg.layer_ratios),
        sliding_window=cfg.sliding_window,
        start_layer=0,
        end_layer=cfg.num_hidden_layers,
        kv_source_layers=list(cfg.kv_source_layer_ids),
        full_size=full_tokens,
        kv_layout=KVLayout.parse(kv_layout),
    )


def _buffers(names: list[str], infos: tuple[list[int], list[int], list[int]], rows: list[int]) -> tuple[PoolBuffer, ...]:
    _, lengths, items = infos
    if len(lengths) != len(names):
        raise RuntimeError(f"SGLang registered {len(lengths)} buffers where {len(names)} ({names}) were expected")
    return tuple(
        PoolBuffer(name, item, per_item, length // item)
        for name, length, item, per_item in zip(names, lengths, items, rows)
    )


def pool_buffer_layout(pool: Any) -> PoolLayout:
    names: list[str] = []
    rows: list[int] = []
    for ratio, sources in pool.sources_by_ratio.items():  # SGLang's wire order: per ratio, KV then index
        names += [f"kv.c{ratio}.L{layer}" for layer in sources]
        names += [f"index.c{ratio}.L{layer}" for layer in sources]
        rows += [PAGE_SIZE // ratio] * (2 * len(sources))
    contiguous = _buffers(names, pool.get_contiguous_buf_infos(), rows)

    layers = range(len(pool.compression_ratios))
    state = _buffers([f"swa.L{i}" for i in layers], pool.get_state_buf_infos(), [pool.swa_page_size] * len(layers))

    pair_sources = list(pool.sources_by_ratio.get(2, ()))
    ring_sizes = [p.ring_size for p in pool.compress_state_pools if p is not None and p.request_scoped]
    request_state = _buffers([f"pair_ring.L{i}" for i in pair_sources], pool.get_request_state_buf_infos(), ring_sizes)
    return PoolLayout(pool.pd_kv_layout(), contiguous, state, request_state)
