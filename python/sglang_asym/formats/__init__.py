"""The released DeepSeek-V4.1 cache quantization formats (fp8 / nvfp4 / mxfp4).

spec         format table and `row_bytes`
codec        fake quantization, numerics and the NaN/inf/overflow policy (see its docstring)
rows         real packed rows and their byte layout
cache_quant  `CacheQuant` and the per-cache entry points the model calls
"""

from .cache_quant import (
    CacheFormat,
    CacheQuant,
    CacheQuantMode,
    quantize_index,
    quantize_main_kv,
    quantize_swa_kv,
)
from .codec import E2M1_LEVELS, fake_quantize
from .rows import pack_rows, unpack_rows
from .spec import FORMATS, FormatName, FormatSpec, row_bytes

__all__ = [
    "E2M1_LEVELS",
    "FORMATS",
    "CacheFormat",
    "CacheQuant",
    "CacheQuantMode",
    "FormatName",
    "FormatSpec",
    "fake_quantize",
    "pack_rows",
    "quantize_index",
    "quantize_main_kv",
    "quantize_swa_kv",
    "row_bytes",
    "unpack_rows",
]
