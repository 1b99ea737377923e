"""SGLang's DeepSeekV4TokenToKVPool for a V4.1 config: its page size and the packed row format each of its
KV layouts holds (test/sglang_plugin/sglang_on_cpu.py builds one on CPU and lists the buffers it registers)."""

from __future__ import annotations

from typing import Any

PAGE_SIZE = 256  # SGLang asserts 256-token pages for the DeepSeek-V4 family
# SGLang's main KV layout -> the model's packed row format (cache/groups.py) and `--cache-quant` mode that
# its pool holds byte for byte: V4.1's own formats in a v41 pool, SGLang's V4 row in a v4 pool
ROW_FORMAT_OF_LAYOUT = {"v41": "release", "v4": "v4"}


def row_format_of_layout(layout: str) -> str:
    try:
        return ROW_FORMAT_OF_LAYOUT[layout]
    except KeyError:
        raise ValueError(f"the reference model's rows fit SGLang's {' / '.join(ROW_FORMAT_OF_LAYOUT)} pool layouts, "
                         f"not {layout!r}") from None


def pool_row_format(pool: Any) -> str:
    """The packed row format a DeepSeekV4TokenToKVPool holds (by its main KV layout)."""
    return row_format_of_layout(pool.swa_kv_pool.kv_layout.value)
