"""EngineMetrics: exact series values in the Prometheus text, separate registries, input checks."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_asym.runtime.metrics import EngineMetrics, QueueName


def samples(metrics: EngineMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "role")))
            out[(s.name, labels)] = s.value
    return out


def test_engine_and_front_updates_render_exact_values():
    m = EngineMetrics("tiny", "decode")
    m.set_queue_size(QueueName.RUNNING, 3)
    m.set_queue_size(QueueName.DECODE_TRANSFER, 2)
    m.observe_transfer(4096, 0.02)
    m.count_transfer_failure()
    m.observe_window_step(0.01, 128)
    m.observe_spec_verify(3, 2)
    m.observe_spec_verify(3, 0)
    m.count_forwards(("full", "full", "row_bucket"))
    m.observe_ttft(0.5, streaming=True)
    m.observe_inter_token(0.01, 4)
    m.observe_request_done(1.5, prompt_tokens=10, completion_tokens=5, finish_reason="stop")
    s = samples(m)
    assert s[("sglang:num_running_reqs", ())] == 3
    assert s[("sglang:num_decode_transfer_queue_reqs", ())] == 2
    assert s[("sglang:num_queue_reqs", ())] == 0
    assert s[("sglang_asym:kv_transfer_bytes_sum", ())] == 4096
    assert s[("sglang_asym:kv_transfer_seconds_count", ())] == 1
    assert s[("sglang:num_transfer_failed_reqs_total", ())] == 1
    assert s[("sglang_asym:window_step_tokens_total", ())] == 128
    assert s[("sglang_asym:spec_draft_tokens_total", ())] == 6
    assert s[("sglang_asym:spec_accepted_tokens_total", ())] == 2
    assert s[("sglang:spec_accept_length_sum", ())] == 4  # (2 + 1) + (0 + 1)
    assert s[("sglang_asym:decode_forwards_total", (("graph_kind", "full"),))] == 2
    assert s[("sglang_asym:decode_forwards_total", (("graph_kind", "row_bucket"),))] == 1
    assert ("sglang_asym:decode_forwards_total", (("graph_kind", "eager"),)) not in s
    assert s[("sglang:time_to_first_token_seconds_count", (("is_streaming", "true"),))] == 1
    assert s[("sglang:time_to_first_token_seconds_count", (("is_streaming", "false"),))] == 0
    assert s[("sglang:inter_token_latency_seconds_count", ())] == 4
    assert s[("sglang:prompt_tokens_total", ())] == 10
    assert s[("sglang:generation_tokens_total", ())] == 5
    assert s[("sglang:num_requests_total", (("finish_reason", "stop"),))] == 1


def test_labels_and_registries_are_per_instance():
    a, b = EngineMetrics("m", "prefill"), EngineMetrics("m", "decode")
    a.set_queue_size(QueueName.PREFILL_INFLIGHT, 5)
    assert 'sglang:num_prefill_inflight_queue_reqs{model_name="m",role="prefill"} 5.0' in a.render().decode()
    assert 'sglang:num_prefill_inflight_queue_reqs{model_name="m",role="decode"} 0.0' in b.render().decode()


def test_bad_updates_are_refused():
    m = EngineMetrics("m", "null")
    with pytest.raises(ValueError, match="queue size of RUNNING must be >= 0, got -1"):
        m.set_queue_size(QueueName.RUNNING, -1)
    with pytest.raises(ValueError, match=r"accepted drafts must be in \[0, 2\], got 3"):
        m.observe_spec_verify(2, 3)
    with pytest.raises(ValueError, match="transfer bytes and seconds must be >= 0"):
        m.observe_transfer(-5, 0.1)
    with pytest.raises(ValueError, match="graph kind must be one of .*, got 'piecewise'"):
        m.count_forwards(("piecewise",))
