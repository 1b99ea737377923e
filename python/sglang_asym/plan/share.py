"""Throughput-balanced prefill share: the fraction of GPUs that should prefill so neither pool idles.

With R_p prefill tokens/s per GPU, R_d decode tokens/s per GPU and r = input / output tokens per request,
a request needs I / R_p prefill GPU-seconds and O / R_d decode GPU-seconds, so P's share of the GPUs is
(I / R_p) / (I / R_p + O / R_d) = r / (r + R_p / R_d).
"""

from __future__ import annotations

import math

from .errors import PlanInputError


def _positive(name: str, value: object, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PlanInputError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise PlanInputError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def prefill_share(input_tokens: float, output_tokens: float, prefill_tokens_per_gpu: float,
                  decode_tokens_per_gpu: float) -> float:
    """P's share of GPUs in [0, 1]: r / (r + R_p / R_d) with r = input / output tokens per request."""
    i = _positive("input tokens", input_tokens, allow_zero=True)
    o = _positive("output tokens", output_tokens, allow_zero=True)
    rp = _positive("prefill tokens per GPU per second", prefill_tokens_per_gpu)
    rd = _positive("decode tokens per GPU per second", decode_tokens_per_gpu)
    if i == 0 and o == 0:
        raise PlanInputError("a request needs input or output tokens: both are 0")
    if o == 0 or i == 0:  # all prefill or all decode (also where i / rp or o / rd would underflow to 0)
        return 1.0 if o == 0 else 0.0
    return 1.0 / (1.0 + (o / i) * (rp / rd))  # = prefill work / (prefill + decode work), without underflow


def share_report(input_tokens: float, output_tokens: float, prefill_tokens_per_gpu: float,
                 decode_tokens_per_gpu: float) -> dict:
    """The share and what it came from, as the `share` subcommand prints it."""
    share = prefill_share(input_tokens, output_tokens, prefill_tokens_per_gpu, decode_tokens_per_gpu)
    return {
        "input_tokens": input_tokens, "output_tokens": output_tokens,
        "ratio_r": (input_tokens / output_tokens) if output_tokens else math.inf,
        "prefill_tokens_per_gpu": prefill_tokens_per_gpu, "decode_tokens_per_gpu": decode_tokens_per_gpu,
        "rp_over_rd": prefill_tokens_per_gpu / decode_tokens_per_gpu,
        "prefill_share": share, "decode_share": 1 - share,
    }
