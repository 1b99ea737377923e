"""SGLang on a CPU machine for the helper scripts here: its process context, a V4.1 KV pool, that pool's buffers."""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from sglang_asym.config import V41Config
from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
from sglang_asym.sglang_plugin.shared.kv_pool import PAGE_SIZE


def _free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def sglang_cpu_context(server_args: Any = None) -> Iterator[None]:
    """Enough of SGLang to construct its V4 model and pools: SGLang's layers read the published ServerArgs and
    its model-parallel groups even at TP 1, so this installs the CPU import stand-ins, publishes `server_args`
    (default `ServerArgs(model_path="dummy")`; give one with no `--device` for the reason below) and starts a
    world-size-1 gloo group on 127.0.0.1. It owns torch.distributed: use it in a dedicated process."""
    cpu_import_gaps.install()
    import torch.distributed as dist

    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    if dist.is_initialized():
        raise RuntimeError("sglang_cpu_context needs a process where torch.distributed is not initialised")
    reset_context()
    # No --device: the rope factory's CPU branch only knows deepseek_yarn scaling, and V4.1's
    # ratio-0 layers have none; the generic branch builds every layer.
    if server_args is None:
        server_args = ServerArgs(model_path="dummy")
    publish(server_args, role="test", ranks=SpawnRanks(world_rank=0))
    parallel_state.init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_local_port()}",
        backend="gloo",
    )
    try:
        parallel_state.initialize_model_parallel(backend="gloo")
        yield
    finally:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
        reset_context()


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
    passes for a V4.1 target model (fp8 KV cache, fp32 compressor state, 256-token pages). Needs
    `sglang_cpu_context()`."""
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


def _buffers(names: list[str], infos: tuple[list[int], list[int], list[int]],
             rows: list[int]) -> tuple[PoolBuffer, ...]:
    _, lengths, items = infos
    if len(lengths) != len(names):
        raise RuntimeError(f"SGLang registered {len(lengths)} buffers where {len(names)} ({names}) were expected")
    return tuple(
        PoolBuffer(name, item, per_item, length // item)
        for name, length, item, per_item in zip(names, lengths, items, rows)
    )


def pool_buffer_layout(pool: Any) -> PoolLayout:
    """The buffers SGLang's PD transfer registers for `pool` (what a peer must match byte for byte), three lists
    in a fixed order: contiguous (compressed KV and index keys, one buffer per KV source layer, an item one
    full page of rows), state (the SWA cache, one buffer per layer, an item one SWA page) and request_state
    (the ratio-2 pending-pair rings, one per ratio-2 source)."""
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
