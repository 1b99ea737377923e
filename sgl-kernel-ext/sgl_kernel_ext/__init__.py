"""sgl_kernel_ext: the device kernels of sglang-asym's asymmetric payload.

Gather a request's payload rows from paged KV-pool buffers into one contiguous extent in wire order,
and scatter an extent back into pool pages: a host-side copy plan of byte segments built once per
request (`plan`), run by one Triton kernel (`triton_copy`) or its torch reference (`reference`).
Row sites (`sites`) describe where rows sit in pages; `layouts` has SGLang's DeepSeek-V4 page layouts, `dsv4` the sites of each payload group there.
"""

from .dsv4 import index_sites, kv_sites, pool_group_sites, ring_sites, swa_sites
from .copy import BACKENDS, gather, resolve_backend, run_plan, scatter
from .layouts import compressed_kv_layout, index_page_layout, kv_page_layout
from .plan import CopyPlan, gather_plan, payload_bytes, scatter_plan
from .reference import run_reference
from .sites import KernelInputError, PageLayout, RowSites, slots_from_page_table

__all__ = ["BACKENDS", "CopyPlan", "KernelInputError", "PageLayout", "RowSites", "compressed_kv_layout",
           "gather", "gather_plan", "index_page_layout", "index_sites", "kv_sites", "kv_page_layout", "payload_bytes", "pool_group_sites", "resolve_backend",
           "ring_sites", "run_plan", "run_reference", "scatter", "scatter_plan", "slots_from_page_table",
           "swa_sites"]
