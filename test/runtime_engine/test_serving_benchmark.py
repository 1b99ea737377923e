"""The pure parts of benchmark/serving.py: percentiles, per-token times from SSE chunks, /metrics
deltas, the per-rate summary, the N=4096 ratio, the JSON layout check and the regular-mode router
command (the sweep itself needs servers and runs outside the test suite)."""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
from pathlib import Path

import pytest

from sglang_asym.testing.router_launch import PrefillWorker

_path = Path(__file__).parents[2] / "benchmark" / "serving.py"
_spec = importlib.util.spec_from_file_location("serving_benchmark", _path)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses resolve their module while the class is built
_spec.loader.exec_module(bench)

METRICS = """# HELP sglang_asym:prefill_compute_seconds Prompt compute
sglang_asym:prefill_compute_seconds_bucket{le="0.5",model_name="m",role="prefill"} 1.0
sglang_asym:prefill_compute_seconds_sum{model_name="m",role="prefill"} 3.5
sglang_asym:prefill_compute_seconds_count{model_name="m",role="prefill"} 2.0
sglang_asym:kv_transfer_bytes_sum{model_name="m",role="prefill"} 1000.0
sglang_asym:kv_transfer_bytes_count{model_name="m",role="prefill"} 2.0
sglang_asym:kv_transfer_bytes_sum{model_name="m",role="other"} 24.0
sglang_asym:kv_transfer_bytes_count{model_name="m",role="other"} 1.0
"""


def test_percentile_interpolates_between_ranks():
    assert bench.percentile([5, 1, 3, 2, 4], 50) == 3
    assert bench.percentile([1, 2, 3, 4, 5], 99) == pytest.approx(4.96)
    assert bench.percentile([7.0], 99) == 7.0
    assert math.isnan(bench.percentile([], 50))
    with pytest.raises(ValueError, match="percentile"):
        bench.percentile([1], 101)
    assert bench.latency_summary([0.1, 0.2, 0.3]) == {"count": 3, "p50_ms": 200.0, "p99_ms": 298.0, "mean_ms": 200.0}


def test_token_times_spread_a_multi_token_chunk_over_its_gap():
    chunks = [(1.0, 1), (1.5, 3), (1.6, 3), (2.0, 4)]
    assert bench.token_times(chunks) == [1.0, 1.25, 1.5, 2.0]
    assert bench.token_times([(0.5, 2)]) == [0.5, 0.5]
    assert bench.token_times([]) == []


def test_metric_totals_and_per_request_deltas():
    names = (bench.COMPUTE_METRIC, bench.BYTES_METRIC)
    before = bench.metric_totals("", names)
    after = bench.metric_totals(METRICS, names)
    assert after == {f"{bench.COMPUTE_METRIC}_sum": 3.5, f"{bench.COMPUTE_METRIC}_count": 2.0,
                     f"{bench.BYTES_METRIC}_sum": 1024.0, f"{bench.BYTES_METRIC}_count": 3.0}
    assert bench.per_request(before, after, bench.COMPUTE_METRIC) == 1.75
    assert bench.per_request(after, after, bench.BYTES_METRIC) is None


def _record(prompt, sent, times, error=None):
    return bench.RequestRecord(prompt, sent, list(times), error)


def test_rate_summary_numbers():
    names = (bench.COMPUTE_METRIC, bench.BYTES_METRIC)
    records = [_record(100, 0.0, [1.0, 1.5, 2.0]), _record(300, 0.5, [3.0, 3.2]),
               _record(50, 0.7, [], error="HTTPError: 500")]
    summary = bench.rate_summary(0.5, records, bench.metric_totals("", names), bench.metric_totals(METRICS, names))
    assert summary["completed"] == 2 and summary["errors"] == ["HTTPError: 500"]
    assert summary["ttft"] == {"count": 2, "p50_ms": 1750.0, "p99_ms": 2485.0, "mean_ms": 1750.0}
    assert summary["itl"]["count"] == 3 and summary["itl"]["p50_ms"] == 500.0
    assert summary["output_throughput_tok_s"] == round(5 / 3.2, 3)
    assert summary["total_throughput_tok_s"] == round(405 / 3.2, 3)
    assert summary["mean_prompt_tokens"] == 200.0
    assert summary["prefill_compute_s_per_request"] == 1.75 and summary["payload_bytes_per_request"] == 341


def test_poisson_arrivals_are_seeded():
    a = bench.poisson_arrivals(2.0, 200, seed=3)
    assert a == bench.poisson_arrivals(2.0, 200, seed=3) and a[0] == 0.0
    assert a == sorted(a) and 0.35 < (a[-1] / 199) < 0.7  # mean gap 1/rate
    with pytest.raises(ValueError):
        bench.poisson_arrivals(0, 3, seed=0)


def test_schema_check_accepts_a_full_result_and_names_a_missing_key():
    names = (bench.COMPUTE_METRIC, bench.BYTES_METRIC)
    rate = bench.rate_summary(1.0, [_record(10, 0.0, [0.5, 0.6])], bench.metric_totals("", names),
                              bench.metric_totals(METRICS, names))
    long = bench.long_prompt_summary(4096, [20.0, 18.0], [8.0, 9.0], 5e6, 2e6)
    assert long["asym_over_symmetric"] == round(8.0 / 18.0, 4) and long["goal_met"] is True
    result = {"command": "x", "config": "small", "device": "cpu", "threads_per_server": 1, "settings": {},
              "modes": {m: {"server_modes": list(bench.MODES[m]), "rates": [copy.deepcopy(rate)]} for m in bench.MODES},
              "long_prompt": long}
    bench.check_schema(result)
    del result["modes"]["asym"]["rates"][0]["itl"]["p99_ms"]
    with pytest.raises(ValueError, match=r"modes.asym.rates\[0\].itl: missing \['p99_ms'\]"):
        bench.check_schema(result)


def test_regular_router_command_and_quick_flags():
    cfg = bench.RegularRouterConfig(prefill=(PrefillWorker("http://127.0.0.1:5", 7),), decode=("http://127.0.0.1:5",),
                                    port=9, retry_max_retries=1)
    cmd = cfg.command(11)
    assert "--pd-disaggregation" not in cmd and "--prefill" not in cmd and "--decode" not in cmd
    assert cmd[cmd.index("--worker-urls") + 1] == "http://127.0.0.1:5" and "--retry-max-retries" in cmd
    args = bench.parse_args(["--quick"])
    assert (args.rate_list, args.requests_per_rate, args.long_n, args.mode_list) == (
        [1.0], 2, 1024, ["colocated", "symmetric", "asym"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--modes", "bogus"])
