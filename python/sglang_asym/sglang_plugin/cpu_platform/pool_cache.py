"""A request's reference-model cache groups, loaded from SGLang's pool and stored back, one layer at a time.

The pool's bytes are the only request state on the CPU route: before a forward computes a request's rows
[start, end), a throwaway reference cache (cache/request.py) gets what the pool holds below `start`, and
after it the rows the forward added go back to the request's own slots (PoolRows). The layers substituted inside
SGLang's own loop (layer_loop.py) do this for one layer around that layer's block.
  window       layer i's window rows from max(0, start - W + 1) (W: the attention window)
  compressed   owner o's compressed rows and index keys [0, start // ratio), and a ratio-2 owner's pending
               token start - 1 when start is odd
"""

from __future__ import annotations

from typing import Any

import torch

from ...cache import RequestCache, index_group, kv_group, swa_group


def load_window(rows: Any, cache: RequestCache, layer: int, req: int, start: int, window: int,
                dtype: torch.dtype, floor: int = 0) -> None:
    """Layer's window rows below `start` (the last `window - 1` of them, none below the layer's `floor`: rows
    below a floor are never read, and bounded replay never writes them) into `cache`."""
    first = max(0, start - window + 1, floor)
    cache.start_swa_at(layer, first)
    cache.rows(swa_group(layer)).append(rows.read_window(layer, req, first, start, dtype))


def load_compressed(rows: Any, cache: RequestCache, owner: int, req: int, start: int, dtype: torch.dtype) -> None:
    """Owner's compressed rows and index keys below `start`, and its pending token (ratio 2, odd start)."""
    ratio = rows.ratio[owner]
    n = start // ratio
    cache.rows(kv_group(owner)).append(rows.read_compressed("kv", owner, req, n, dtype))
    cache.rows(index_group(owner)).append(rows.read_compressed("index", owner, req, n, dtype))
    if ratio == 2 and start % 2:
        cache.set_tail(owner, rows.read_tail(owner, req, start - 1))


def store_window(rows: Any, cache: RequestCache, layer: int, req: int, start: int, end: int) -> None:
    """Layer's window rows of [start, end) to the pool; a long chunk keeps only its last window (attention
    drops the rest): no later query reads those."""
    window = cache.rows(swa_group(layer))
    kept = max(start, window.start)
    rows.write_window(layer, req, kept, window.read(kept, end))


def store_compressed(rows: Any, cache: RequestCache, owner: int, req: int, start: int, end: int,
                     verify: bool = False) -> None:
    """Owner's compressed rows and index keys that [start, end) completed, and its pending token."""
    ratio = rows.ratio[owner]
    first, last = start // ratio, end // ratio
    rows.write_compressed("kv", owner, req, first, cache.rows(kv_group(owner)).read(first, last))
    rows.write_compressed("index", owner, req, first, cache.rows(index_group(owner)).read(first, last))
    if ratio == 2 and verify:
        # the accepted length is known only after this forward: each odd one, s < keep <= end, needs
        # its pending token keep - 1 in the ring (a speculating server's ring has a row for each)
        for token in range(start + start % 2, end, 2):
            rows.write_tail(owner, req, token, cache.pair_input(owner, token))
    elif ratio == 2 and end % 2:
        rows.write_tail(owner, req, end - 1, cache.tail(owner))
