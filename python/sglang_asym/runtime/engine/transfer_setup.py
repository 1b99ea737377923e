"""What both prefill and both decode engines (asymmetric and symmetric PD) set up the same way for the
Mooncake transfer layer: the wire row format, one registered row pool per group, the transfer config,
and waiting for a sender or receiver to reach a terminal state."""

from __future__ import annotations

import asyncio
import time

from ...config import V41Config
from ...transfer import KVPoll, RowPool, TransferCompat, TransferConfig
from .options import EngineOptions
from ...cache import GroupKind, cache_group
from ...cache.groups import row_format_for_cache_quant

POLL_S = 0.002
# Staged transfers (transfer/extents.py): P's staging and D's landing buffer. A request whose payload
# does not fit the free part goes direct, slot run by slot run.
STAGED_BUFFER_BYTES = 16 << 20


def row_format_for(options: EngineOptions) -> str:
    # Packing is lossless only when the model's caches already hold rows quantized the same way.
    return row_format_for_cache_quant(options.cache_quant)


def rows_per_request(cfg: V41Config, options: EngineOptions, group: str) -> int:
    """Most rows of `group` one request can ship (window rows: at most one window; aux rows: one)."""
    gid = cache_group(group)
    if gid is None or gid.kind is GroupKind.TAIL:
        return 1  # compressor tails and aux rows
    if gid.kind is GroupKind.SWA:
        return cfg.sliding_window
    return options.max_total_tokens // gid.tokens_per_row(cfg) + 1


def make_pools(cfg: V41Config, options: EngineOptions, compat: TransferCompat) -> dict[str, RowPool]:
    """One registered pool per row group of the compat, sized for max_running requests."""
    return {f.group: RowPool.zeros(f.group, rows_per_request(cfg, options, f.group) * options.max_running, f.row_bytes)
            for f in compat.row_formats}


def transfer_config_for(options: EngineOptions, host: str) -> TransferConfig:
    return TransferConfig(host=host, bootstrap_timeout_s=options.transfer_timeout_s,
                          landing_bytes=STAGED_BUFFER_BYTES, staging_bytes=STAGED_BUFFER_BYTES)


def overall_timeout_s(config: TransferConfig) -> float:
    """How long an engine waits for a transfer's outcome; the transfer layer bounds each phase itself."""
    return config.bootstrap_timeout_s + config.waiting_timeout_s + 5


async def wait_terminal(handle, timeout_s: float) -> KVPoll:
    deadline = time.monotonic() + timeout_s
    while not handle.poll().is_terminal:
        if time.monotonic() > deadline:
            return handle.poll()
        await asyncio.sleep(POLL_S)
    return handle.poll()
