"""Suggested alarms for a plan: the SLOs as p99 alarms, the error rate, and queue / utilisation alarms that fire
before the SLOs do."""

from __future__ import annotations

from typing import Any

ERROR_RATE = 0.01  # 1% of requests


def suggested_alarms(slo: Any, decode: Any, prefill_utilization: float) -> list[dict]:
    """slo: sim.Slo; decode: planner.DecodeSizing. Thresholds in the units operators alarm on."""
    return [
        {"metric": "ttft-p99", "threshold_ms": round(slo.ttft_s * 1000, 1), "for": "5m"},
        {"metric": "itl-p99", "threshold_ms": round(slo.itl_s * 1000, 1), "for": "5m"},
        {"metric": "error-rate", "threshold": ERROR_RATE, "for": "5m"},
        {"metric": "decode-running-per-rank", "threshold": decode.batch_per_rank,
         "why": "a full running batch queues windows: TTFT grows before ITL does"},
        {"metric": "decode-step-p99", "threshold_ms": round(slo.itl_s * 1000 * 0.8, 1),
         "why": "steps past 80% of the ITL SLO leave no room for a window chunk"},
        {"metric": "prefill-utilization", "threshold": round(min(prefill_utilization + 0.1, 0.95), 2),
         "why": "the planned utilisation plus 10 points: queueing then takes TTFT past the SLO"},
    ]
