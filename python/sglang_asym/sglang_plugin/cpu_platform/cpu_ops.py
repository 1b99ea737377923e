"""The four SGLang ops on P's forward (asym-prefill: SGLang's own layer loop, prefill/cut_hook.py) that have no
CPU build (or only Triton's CPU interpreter), replaced op for op by the CPU patches (patches.py); everything
around them is SGLang's.

  sglang.kernels.ops.layernorm.mhc.mhc_combine                      REPLACE  `combine_in_torch`
        The mHC combine of layer L's input (deepseek_v4_mhc._combine) is a Triton kernel. Under Triton's CPU
        interpreter (TRITON_INTERPRET=1) it runs, but it rounds its fp32 sum to bf16 by truncation where a GPU
        rounds to nearest even: about half of the outputs differ by one bf16 unit in the last place (measured
        on random rows: 8,125 of 16,384; after the layer's RMSNorm, 39,752 of 76,800 values, by up to 0.03125). Here:
        the kernel's sum in torch, sum_k pre[m, k] * x[m, k] in fp32 in stream order, rounded once to the
        output dtype (exactly the reference model's collapse).
  DeepSeekV4TokenToKVPool.set_extra_key_buffer_fused               REPLACE  `store_compressed_kv`
        Layer L's compressed-KV store (`_low_ratio_write_group` of the attention backend) is the JIT-CUDA
        `fused_store_cache` (sglang/kernels/ops/attention/dsv4/attn.py); on a CPU machine its build fails:
        "nvcc fatal : Unsupported gpu architecture 'compute_00'". Here: SGLang's own torch rope
        (`dsv41_sparse.rope_tail`, with the freqs SGLang passes) and the pool's row format written by
        PoolRows, the same codec the reference model's caches use. Everything before the store (the
        compressor's `project` / `finish`, the index keys and their fp4 store `set_index_k_fp4`) is SGLang's
        `_low_ratio_compress_torch` on CPU. Its index keys have the reference's values; their bytes differ in
        one respect: SGLang's quantizer writes a value that rounds to zero as +0 (code 0x0), the reference's
        mxfp4 packer keeps a negative one's sign (0x8).
  kvcache.dsv4_fp4_index_k_cache.store_fp4_index_k_cache            REPLACE  `store_fp4_index_k_in_torch`
        The fp4 index-key store of `set_index_k_fp4`: two Triton kernels (SGLang's per-32 ue8m0 e2m1 quantizer
        `quantize_fp4_indexer_tensor`, then the paged store) launched one program per row. Under Triton's CPU
        interpreter each program is Python: it was 59% of P's time on a 2,000-token prompt (py-spy). Here: the
        same arithmetic in torch (fp32 group maxima / 6 floored at 1e-4, the exponent rounded up and clamped to
        [1, 254], each value divided by its power-of-two scale, the kernel's e2m1 thresholds, a sign only on a
        nonzero code), written to the same page bytes; equal byte for byte to the kernels (test_index_k_store.py).
  DeepseekV4AttnBackend.init_forward_metadata                       REPLACE  `low_ratio_forward_metadata`
        SGLang's builds FlashMLA / DeepGEMM metadata (CUDA). The low-ratio source writes read only the
        cache-write locations: `core_metadata.raw_out_loc` (the batch's out_cache_loc) and the c1 / c2 slots
        SGLang's own `_low_ratio_compression_metadata` derives from it and each row's causal length.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ...config import V41Config
from ...model.quant import Quantizer


def combine_in_torch(x_flat: torch.Tensor, pre: torch.Tensor, hc: int, out_dtype: torch.dtype) -> torch.Tensor:
    """y[m, h] = sum_k pre[m, k] * x_flat[m, k * H + h], summed in fp32 in stream order, rounded once."""
    streams = x_flat.unflatten(1, (hc, -1)).float()
    acc = pre[:, 0, None].float() * streams[:, 0]
    for k in range(1, hc):
        acc = acc + pre[:, k, None].float() * streams[:, k]
    return acc.to(out_dtype)


@functools.lru_cache(maxsize=4)
def _model_config(model_path: str) -> V41Config:
    return V41Config.from_json_file(model_path)


def served_config() -> V41Config:
    """The V4.1 config of the model this SGLang process serves."""
    from sglang.srt.runtime_context import get_server_args

    return _model_config(get_server_args().model_path)


def store_compressed_kv(pool: Any, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor,
                        freqs_cis: torch.Tensor | None = None) -> None:
    """Replaces DeepSeekV4TokenToKVPool.set_extra_key_buffer_fused: `cache_k` [n, head_dim] rows of owner
    `layer_id` into its compressed pool at slots `loc`, roped first when `freqs_cis` is given (an fp4 pool
    takes the un-rotated latent), quantized as the pool stores its rows."""
    from sglang.srt.layers.attention.dsv4.dsv41_sparse import rope_tail

    from ..shared.pool_rows import PoolRows

    cfg = served_config()
    rows = PoolRows(pool, torch.empty(0, 0, dtype=torch.int32), cfg)  # slot writes read no req_to_token
    if freqs_cis is not None:
        cache_k = rope_tail(cache_k, freqs_cis, cfg.qk_rope_head_dim)
    quant = Quantizer(rows.row_format, rope_channels=cfg.qk_rope_head_dim)
    rows.write_compressed_slots("kv", layer_id, loc, quant.main_kv(cache_k))


_INDEX_K_DIM, _INDEX_K_GROUP = 128, 32  # SGLang's fp4 index keys: 128 values, a ue8m0 scale per 32
_INDEX_K_PAYLOAD_BYTES, _INDEX_K_SCALE_BYTES = _INDEX_K_DIM // 2, _INDEX_K_DIM // _INDEX_K_GROUP
# the kernel's e2m1 code boundaries: a magnitude above the k-th (at or above, round-to-nearest-even) is code >= k + 1
_E2M1_BOUNDARIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _sglang_e2m1_codes(scaled: torch.Tensor, rne: bool) -> torch.Tensor:
    """uint8 e2m1 codes of fp32 values already divided by their scale, as SGLang's `_fp4_e2m1_code` (thresholds
    exclusive) or `_fp4_e2m1_code_rne` (inclusive, an odd code at an exact boundary drops to the even one)."""
    magnitude = scaled.abs().clamp(max=6.0)
    code = torch.zeros(scaled.shape, dtype=torch.uint8, device=scaled.device)
    on_boundary = torch.zeros(scaled.shape, dtype=torch.bool, device=scaled.device)
    for boundary in _E2M1_BOUNDARIES:
        code += (magnitude >= boundary if rne else magnitude > boundary).to(torch.uint8)
        if rne:
            on_boundary |= magnitude == boundary
    if rne:
        code -= (on_boundary & (code & 1 == 1)).to(torch.uint8)
    sign = ((scaled < 0) & (code != 0)).to(torch.uint8)
    return code | (sign << 3)


def store_fp4_index_k_in_torch(input: torch.Tensor, cache: torch.Tensor, loc: torch.Tensor, *, page_size: int,
                               rne: bool = False) -> None:
    """Replaces sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache.store_fp4_index_k_cache: index keys `input`
    [..., 128] quantized per 32 values to e2m1 codes with a ue8m0 scale, and row i's 64 code bytes and 4 scale
    bytes written to page loc[i] // page_size of `cache` [pages, page_size * 68] (codes first, then scales)."""
    if input.shape[-1] != _INDEX_K_DIM:
        raise ValueError(f"fp4 index keys have {_INDEX_K_DIM} values per row, got {input.shape[-1]}")
    values = input.reshape(-1, _INDEX_K_DIM).float()
    if values.shape[0] == 0:
        return
    groups = values.view(-1, _INDEX_K_SCALE_BYTES, _INDEX_K_GROUP)
    # the kernel's exponent in int32 before its clamp (formats.codec's uint8 ue8m0 would wrap a NaN group's 256)
    floor = torch.clamp(groups.abs().amax(dim=-1) / 6.0, min=1.0e-4)
    bits = floor.view(torch.int32)
    exponent = (((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)).clamp(1, 254)
    scale = (exponent << 23).view(torch.float32)
    codes = _sglang_e2m1_codes((groups / scale.unsqueeze(-1)).view(-1, _INDEX_K_DIM), rne)
    payload = codes[:, 0::2] | (codes[:, 1::2] << 4)
    loc = loc.reshape(-1).to(torch.int64)
    page, slot = loc // page_size, loc % page_size
    at = slot.unsqueeze(1) * _INDEX_K_PAYLOAD_BYTES + torch.arange(_INDEX_K_PAYLOAD_BYTES)
    cache[page.unsqueeze(1), at] = payload
    scales_at = page_size * _INDEX_K_PAYLOAD_BYTES + slot.unsqueeze(1) * _INDEX_K_SCALE_BYTES
    cache[page.unsqueeze(1), scales_at + torch.arange(_INDEX_K_SCALE_BYTES)] = exponent.to(torch.uint8)


@dataclass(frozen=True)
class LowRatioWrites:
    """The cache-write locations of one forward, as SGLang's DSV4AttnMetadata names them."""

    raw_out_loc: torch.Tensor  # [rows] the batch's out_cache_loc
    c1_out_loc: torch.Tensor  # [rows] ratio-1 compressed slot of each row
    c2_out_loc: torch.Tensor  # [rows] ratio-2 compressed slot of each row that completes a pair, else -1


@dataclass(frozen=True)
class CpuForwardMetadata:
    """What the attention backend's low-ratio source writes read of `forward_metadata` on CPU."""

    core_metadata: LowRatioWrites


def low_ratio_forward_metadata(backend: Any, forward_batch: Any) -> None:
    """Replaces DeepseekV4AttnBackend.init_forward_metadata: the write locations of a plain extend batch (the
    only forward that reaches SGLang's attention backend on CPU: P's layer-L KV writes); nothing otherwise."""
    from sglang.srt.layers.attention.deepseek_v4_backend import _low_ratio_compression_metadata

    backend.tail_forward_metadata = None
    mode = forward_batch.forward_mode
    if mode.is_idle() or not mode.is_extend_without_speculative():
        backend.forward_metadata = None
        return
    raw = forward_batch.out_cache_loc
    causal_lens = forward_batch.positions[: raw.shape[0]].to(torch.int64) + 1
    c1, _ = _low_ratio_compression_metadata(1, causal_lens, raw)
    c2, _ = _low_ratio_compression_metadata(2, causal_lens, raw)
    backend.forward_metadata = CpuForwardMetadata(LowRatioWrites(raw, c1, c2))
