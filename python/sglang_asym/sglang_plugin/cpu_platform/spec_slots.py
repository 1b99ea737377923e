"""Torch versions of the two slot-table helpers SGLang's speculative decoding calls, for the CPU platform.

SGLang 0.5.23 picks Triton, NPU or sgl-kernel implementations by device flags (`_is_cpu` means its
in-tree CPU engine); on this out-of-tree platform none applies:
  assign_req_to_token_pool   (mem_cache.allocation.assign_req_to_token_pool_func, patched REPLACE in
                             patches.py) writes the slots `alloc_for_spec_decode` allocated for each
                             request's speculative window into its req_to_token row
  speculative_cache_locs     (the platform's `get_speculative_cache_locs_fn`, asked by
                             kernels.ops.speculative.cache_locs) reads the slots of each request's verify
                             window back out of req_to_token
"""

from __future__ import annotations

from typing import Any

import torch


def assign_req_to_token_pool(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, start_offset: torch.Tensor,
                             end_offset: torch.Tensor, out_cache_loc: torch.Tensor, batch_size: int) -> None:
    """req_to_token[r, start:end] = the next (end - start) entries of out_cache_loc, request after request."""
    at = 0
    rows = zip(req_pool_indices.tolist()[:batch_size], start_offset.tolist(), end_offset.tolist())
    for req, start, end in rows:
        req_to_token[req, start:end] = out_cache_loc[at:at + end - start].to(req_to_token.dtype)
        at += end - start


def speculative_cache_locs(*, req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                           start_offset: torch.Tensor, end_offset: torch.Tensor, batch_size: int,
                           draft_token_num: int, device: Any) -> torch.Tensor:
    """The slots req_to_token[r, start:end] of every request, concatenated (int64, as SGLang's kernels give)."""
    rows = zip(req_pool_indices.tolist()[:batch_size], start_offset.tolist(), end_offset.tolist())
    slots = [req_to_token[req, start:end] for req, start, end in rows]
    if not slots:
        return torch.empty(0, dtype=torch.int64, device=device)
    return torch.cat(slots).to(device=device, dtype=torch.int64)
