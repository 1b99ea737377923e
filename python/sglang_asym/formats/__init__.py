"""The cache quantization formats: the released DeepSeek-V4.1 ones (fp8 / nvfp4 / mxfp4) and SGLang's V4 row.

spec         format table and `row_bytes`
codec        fake quantization, numerics and the NaN/inf/overflow policy (see its docstring)
rows         real packed rows and their byte layout
v4_rows      SGLang's V4 main-KV row (fp8 nope + bf16 rope)
cache_quant  `CacheQuant` and the per-cache entry points the model calls
"""

from .cache_quant import (
    CACHE_QUANT_MODES,
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
    "CACHE_QUANT_MODES",
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
