"""The decode role's transfer destinations, computed for the prefix B = N - W instead of the prompt N.

SGLang's `DecodePreallocQueue.pop_preallocated` derives every destination from the whole prompt
length: the KV pages of [0, N), the SWA pages of the window ending at N, the request-state (ring)
rows of position N. An asym-prefill server ships the state at B, computed by its own `_send_kv_chunk`
for its cut request (origin length B): pages of [0, B), the SWA pages of
[floor_page(max(prefix, B - window)), B), and the ring rows of B. `destinations_for_prefix` recomputes
D's side the same way for B, so SGLang's sender pairs every entry with the right slot (D's pool tests
check it byte for byte). Destinations of [B, N) stay allocated: D's window step writes them.
"""

from __future__ import annotations

from typing import Any, Sequence


class DestinationError(RuntimeError):
    """A state component this module does not know how to place for the prefix."""


def destinations_for_prefix(queue: Any, req: Any, boundary: int, state_indices: Sequence[Any] | None
                            ) -> tuple[Any, list[Any] | None]:
    """(kv_indices, state_indices) of `req` for a transfer that ends at `boundary` (D's prealloc queue)."""
    from sglang.srt.disaggregation.base.conn import StateType
    from sglang.srt.mem_cache.common import kv_to_page_indices, page_align_floor

    slot = int(req.kv.req_pool_idx)
    prefix = int(req.kv.cache_protected_len or 0)
    if prefix > boundary:
        raise DestinationError(f"request {req.rid}: decode prefix {prefix} lies past the boundary {boundary}")
    allocator = queue.token_to_kv_pool_allocator
    row = queue.req_to_token_pool.req_to_token[slot]
    kv_indices = allocator.translate_kv_indices_for_transfer(row[prefix:boundary])
    if state_indices is None:
        return kv_indices, None
    page_size = allocator.page_size

    def swa_pages() -> Any:
        start = page_align_floor(max(prefix, boundary - queue.scheduler.sliding_window_size), page_size)
        return kv_to_page_indices(allocator.translate_swa_indices_for_transfer(row[start:boundary]), page_size)

    def request_state_rows() -> Any:
        return queue.token_to_kv_pool.request_state_transfer_indices(slot, boundary)

    placed = {StateType.SWA: swa_pages, StateType.DSV4_REQUEST_STATE: request_state_rows}
    out = []
    for state_type, indices in zip(queue.kv_manager.kv_args.state_types, state_indices):
        if state_type in placed:
            out.append(placed[state_type]())
        elif indices is None:
            out.append(None)
        else:
            raise DestinationError(f"request {req.rid}: state component {state_type} has destinations this "
                                   "asymmetric decode server cannot place for its prefix")
    return kv_indices, out
