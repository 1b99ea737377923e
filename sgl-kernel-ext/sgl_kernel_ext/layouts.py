"""SGLang 0.5.23's page layouts of the DeepSeek-V4 family pools, as PageLayouts.

Facts taken from SGLang (`sglang/kernels/ops/attention/dsv4/kv_layout.py`, `KVLayout`, and the
index-K caches of `deepseek_v4_memory_pool.py`); test/kernels checks them against SGLang's own
`KVLayout.row_addressing` and `page_bytes`:
  KV / SWA pages   block-split (every slot's data, then every slot's scales, the page padded to the
                   reader's TMA row stride) or, for the `_new` layouts, interleaved (data then scales
                   per slot). v4: 576 data bytes (448 fp8 nope + 64 bf16 rope) + 8 (7 ue8m0 + 1 pad);
                   v41: 512 fp8 + 16 ue8m0; v41_fp4: 256 e2m1 + 32 e4m3.
  compressed KV    next to a v4 main cache every ratio is v4; next to v41 the ratio-1/2 caches are
                   v41_fp4 and the others v41 (SGLang's `resolve_compressed_kv_layout`, default option).
  index keys       pages of 64 slots, block-split without padding: fp4 keys head_dim/2 bytes + head_dim/32
                   ue8m0 scales; fp8 keys head_dim bytes + 4 bytes (one fp32 scale per 128 values).
  pair rings       plain rows (`PageLayout.rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .sites import KernelInputError, PageLayout

SGLANG_PAGE_SIZE = 256      # tokens per page (SGLang asserts it for the DeepSeek-V4 family)
SGLANG_INDEX_PAGE_SIZE = 64  # index-K slots per index page


@dataclass(frozen=True)
class KVPageFormat:
    data_bytes: int
    scale_bytes: int
    page_align: int
    interleaved: bool


KV_FORMATS = {
    "v4": KVPageFormat(576, 8, 576, False),
    "v41": KVPageFormat(512, 16, 512, False),
    "v41_fp4": KVPageFormat(256, 32, 256, False),
    "uniform_fp8": KVPageFormat(512, 0, 512, False),
    "v41_new": KVPageFormat(512, 16, 528, True),
    "v41_fp4_new": KVPageFormat(256, 32, 288, True),
}
MAIN_LAYOUTS = ("v4", "v41", "v41_new")


def _format(name: str) -> KVPageFormat:
    try:
        return KV_FORMATS[name]
    except KeyError:
        raise KernelInputError(f"unknown SGLang KV layout {name!r}; known: {sorted(KV_FORMATS)}") from None


def kv_page_layout(name: str, page_size: int = SGLANG_PAGE_SIZE) -> PageLayout:
    """The page of a KV (or SWA) buffer in SGLang's layout `name`, page_size slots."""
    f = _format(name)
    raw = page_size * (f.data_bytes + f.scale_bytes)
    page_bytes = -(-raw // f.page_align) * f.page_align
    make = PageLayout.interleaved if f.interleaved else PageLayout.block_split
    return make(page_size, f.data_bytes, f.scale_bytes, page_bytes)


def compressed_kv_layout(main: str, ratio: int) -> str:
    """The layout of ratio `ratio`'s compressed KV next to a `main` cache (SGLang's default option)."""
    if main not in MAIN_LAYOUTS:
        raise KernelInputError(f"{main!r} is not a main-cache layout; choose one of {MAIN_LAYOUTS}")
    if main == "v4":
        return "v4"
    fp4 = ratio in (1, 2)
    interleaved = main == "v41_new"
    return {(False, False): "v41", (True, False): "v41_fp4", (False, True): "v41_new",
            (True, True): "v41_fp4_new"}[(fp4, interleaved)]


def index_page_layout(index_head_dim: int, fp4: bool, page_size: int = SGLANG_INDEX_PAGE_SIZE) -> PageLayout:
    """An index-K page: every slot's key bytes, then every slot's scale bytes."""
    if fp4:
        data, scales = index_head_dim // 2, index_head_dim // 32
    else:
        data, scales = index_head_dim, index_head_dim // 128 * 4
    return PageLayout.block_split(page_size, data, scales)
