"""A test aid: dump a request's rows from SGLang's pool on P (once its prompt is computed) and on D
(once SGLang's transfer committed it), so a test can compare them byte for byte across the two processes.

Off unless `SGLANG_ASYM_POOL_DUMP_DIR` names a directory (never set in production). Files are
`{dir}/{role}-{bootstrap_room}.npz` (role `prefill` or `decode`) holding pool_rows.PoolRows.snapshot
of the request, plus `num_tokens`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from .pool_rows import PoolRows

log = logging.getLogger(__name__)

DUMP_DIR_ENV = "SGLANG_ASYM_POOL_DUMP_DIR"
COMMIT_TRANSFER = "sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req"


def dump_dir() -> Path | None:
    value = os.environ.get(DUMP_DIR_ENV)
    return Path(value) if value else None


def dump(rows: PoolRows, role: str, room: int | None, req: int, num_tokens: int) -> None:
    directory = dump_dir()
    if directory is None or not room:  # no room, or room 0: SGLang's fake transfer (health checks) moves nothing
        return
    snapshot = rows.snapshot(req, num_tokens)
    path = directory / f"{role}-{room}.npz"
    np.savez(path, num_tokens=np.array(num_tokens), **snapshot)
    log.info("sglang-asym: dumped %d groups of room %s to %s", len(snapshot), room, path)


def after_commit_transfer(result: Any, queue: Any, decode_req: Any, *args: Any, **kwargs: Any) -> None:
    """D: the rows SGLang's transfer wrote for this request, right after it committed them."""
    from ..config import V41Config

    req = decode_req.req
    if dump_dir() is None or req.kv.req_pool_idx is None:
        return
    scheduler = queue.scheduler
    cfg = V41Config.from_json_file(scheduler.server_args.model_path)
    rows = PoolRows(scheduler.token_to_kv_pool_allocator.get_kvcache(), scheduler.req_to_token_pool.req_to_token, cfg)
    dump(rows, "decode", req.bootstrap_room, int(req.kv.req_pool_idx), len(req.origin_input_ids))
