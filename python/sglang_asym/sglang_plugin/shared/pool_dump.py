"""Test aids: dump a request's rows from SGLang's pool on P (once its prompt is computed) and on D
(once SGLang's transfer committed it), so a test can compare them byte for byte across the two processes.

Off unless `SGLANG_ASYM_POOL_DUMP_DIR` names a directory (never set in production). Files are
`{dir}/{role}-{bootstrap_room}.npz` (role `prefill` or `decode`) holding pool_rows.PoolRows.snapshot
of the request, plus `num_tokens`. A symmetric pair dumps the whole prompt N; an asymmetric pair dumps
what crosses (`transferred_extent`): the prefix B, only the layers whose window rows ship, and only
the W - 1 window rows the manifest ships.
With `SGLANG_ASYM_FORWARD_LOG` naming a file, every forward of the CPU route appends the layers it ran and the
rows it computed per request (`log_forward`), so a test can count what each role computed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .pool_rows import PoolRows

log = logging.getLogger(__name__)

DUMP_DIR_ENV = "SGLANG_ASYM_POOL_DUMP_DIR"
FORWARD_LOG_ENV = "SGLANG_ASYM_FORWARD_LOG"  # a JSON-lines file: one line per forward of the CPU route


def dump_dir() -> Path | None:
    value = os.environ.get(DUMP_DIR_ENV)
    return Path(value) if value else None


@dataclass(frozen=True)
class Extent:
    """What this server's transfer carries of one request: its first `num_tokens` tokens, the last
    `window_rows` window rows of `swa_layers` (None: every layer)."""

    num_tokens: int
    swa_layers: tuple[int, ...] | None
    window_rows: int


def transferred_extent(cfg: Any, prompt_len: int) -> Extent:
    """The whole prompt, every layer and W window rows in a symmetric pair; in an asymmetric one B, the
    shipped window layers and the manifest's W - 1 window rows below B."""
    from sglang.srt.runtime_context import get_server_args

    from ...split import SplitPlan
    from .settings import settings_of

    settings = settings_of(get_server_args())
    if settings is None:
        return Extent(prompt_len, None, cfg.sliding_window)
    split = SplitPlan(cfg, prompt_len, settings.window, settings.semantics)
    start, end = split.encoder_swa_rows
    layers = tuple(split.plan.encoder_layers) if split.ships_encoder_swa else ()
    return Extent(split.boundary, layers, end - start)


def dump(rows: PoolRows, role: str, room: int | None, req: int, extent: Extent) -> None:
    directory = dump_dir()
    if directory is None or not room:  # no room, or room 0: SGLang's fake transfer (health checks) moves nothing
        return
    snapshot = rows.snapshot(req, extent.num_tokens, extent.swa_layers, extent.window_rows)
    path = directory / f"{role}-{room}.npz"
    np.savez(path, num_tokens=np.array(extent.num_tokens), **snapshot)
    log.info("sglang-asym: dumped %d groups of room %s to %s", len(snapshot), room, path)


def after_commit_transfer(result: Any, queue: Any, decode_req: Any, *args: Any, **kwargs: Any) -> None:
    """D: the rows SGLang's transfer wrote for this request, right after it committed them."""
    from ...config import V41Config

    req = decode_req.req
    if dump_dir() is None or req.kv.req_pool_idx is None:
        return
    scheduler = queue.scheduler
    cfg = V41Config.from_json_file(scheduler.server_args.model_path)
    rows = PoolRows(scheduler.token_to_kv_pool_allocator.get_kvcache(), scheduler.req_to_token_pool.req_to_token, cfg)
    extent = transferred_extent(cfg, len(req.origin_input_ids))
    dump(rows, "decode", req.bootstrap_room, int(req.kv.req_pool_idx), extent)


def log_forward(role: str, mode: str, layers: Sequence[int], rows: Sequence[tuple[int | None, int, int]],
                seconds: float, decode_rows: int = 0,
                pieces: Sequence[tuple[Sequence[int], Sequence[tuple[int | None, int, int]]]] = ()) -> None:
    """Test aid: one line per forward: its mode (extend / decode / mixed), the layers it ran, each request's
    (room, start, end) rows (the first `decode_rows` of them decode rows, the rest extend rows), the
    forward's wall time, and per model pass inside it (`pieces`) the layers that pass ran and the rows it ran
    them on (so a test sees bounded replay run the late layers on the window rows only)."""
    path = os.environ.get(FORWARD_LOG_ENV)
    if not path:
        return
    import json

    with open(path, "a") as out:
        out.write(json.dumps({"role": role, "mode": mode, "layers": list(layers), "rows": [list(r) for r in rows],
                              "decode_rows": decode_rows,
                              "pieces": [{"layers": list(ran), "rows": [list(r) for r in on]} for ran, on in pieces],
                              "seconds": round(seconds, 6)}) + "\n")
