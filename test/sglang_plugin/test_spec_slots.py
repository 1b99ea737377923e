"""The torch slot-table helpers of the CPU engine's speculative decoding (spec_slots.py), on SGLang's layout:
req_to_token[req slot, position] = KV slot."""

from __future__ import annotations

import torch

from sglang_asym.sglang_plugin.cpu_platform.spec_slots import assign_req_to_token_pool, speculative_cache_locs


def test_a_steps_new_slots_land_in_each_requests_row_and_read_back_in_order():
    req_to_token = torch.zeros(4, 16, dtype=torch.int32)
    slots, starts, ends = torch.tensor([2, 0]), torch.tensor([3, 5]), torch.tensor([6, 9])
    out_cache_loc = torch.arange(100, 107, dtype=torch.int64)  # 3 slots for req 2, then 4 for req 0
    assign_req_to_token_pool(slots, req_to_token, starts, ends, out_cache_loc, batch_size=2)
    assert req_to_token[2, 3:6].tolist() == [100, 101, 102] and req_to_token[0, 5:9].tolist() == [103, 104, 105, 106]
    assert int(req_to_token.count_nonzero()) == 7
    locs = speculative_cache_locs(req_pool_indices=slots, req_to_token=req_to_token, start_offset=starts,
                                  end_offset=ends, batch_size=2, draft_token_num=3, device="cpu")
    assert locs.dtype == torch.int64 and locs.tolist() == list(range(100, 107))


def test_an_empty_batch_reads_no_slots():
    locs = speculative_cache_locs(req_pool_indices=torch.tensor([], dtype=torch.int64),
                                  req_to_token=torch.zeros(2, 4, dtype=torch.int32), start_offset=torch.tensor([]),
                                  end_offset=torch.tensor([]), batch_size=0, draft_token_num=6, device="cpu")
    assert locs.shape == (0,) and locs.dtype == torch.int64
