"""Reference DeepSeek-V4.1 model (CPU and CUDA, fp32/bf16) with per-request paged caches."""

from .model import InvalidInput, V41Model
from .steps import decode_step, greedy_continue, prefill

__all__ = ["InvalidInput", "V41Model", "decode_step", "greedy_continue", "prefill"]
