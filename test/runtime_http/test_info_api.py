"""Health, info, models, metrics and abort routes."""

from __future__ import annotations

import http.client
import json
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_asym.runtime.engine_api import EngineRole

from .harness import get, post_json, post_sse, wait_until


def get_json(url, path):
    status, _, data = get(url, path)
    return status, json.loads(data)


def test_health_follows_the_engine(serve):
    front = serve()
    assert get(front.url, "/health")[0] == 200
    front.engine.healthy = False
    assert get(front.url, "/health")[0] == 503
    assert get(front.url, "/health_generate")[0] == 503


@pytest.mark.parametrize("role", list(EngineRole))
def test_health_generate_runs_a_one_token_probe(serve, role):
    front = serve(role=role)
    assert get(front.url, "/health_generate")[0] == 200
    probe = front.engine.requests[-1]
    assert probe.rid.startswith("HEALTH_CHECK_") and probe.input_ids == (0,)
    assert probe.sampling.max_new_tokens == 1 and probe.sampling.temperature == 0
    if role is EngineRole.COLOCATED:
        assert probe.bootstrap is None
    else:
        assert probe.bootstrap.is_health_probe and probe.bootstrap.room == 0
    assert get(front.url, "/health_generate")[0] == 200  # room 0 is not "in use" for probes


def test_health_generate_times_out_to_503(serve):
    front = serve(token_delay_s=5.0)  # the fixture's probe timeout is 2 s
    assert get(front.url, "/health_generate")[0] == 503
    wait_until(lambda: len(front.engine.aborted) == 1, what="the timed-out probe to be aborted")


def test_model_info_and_alias(serve, checkpoint_dir):
    front = serve(role=EngineRole.DECODE)
    status, info = get_json(front.url, "/model_info")
    assert status == 200
    assert info["model_path"] == str(checkpoint_dir) and info["tokenizer_path"] == str(checkpoint_dir)
    assert info["served_model_name"] == "tiny" and info["is_generation"] is True
    assert info["disaggregation_mode"] == "decode"
    assert info["architectures"] == ["DeepseekV41ForCausalLM"] and info["eos_token_ids"] == [1]
    assert get_json(front.url, "/get_model_info") == (200, info)


def test_server_info_and_alias(serve):
    front = serve(role=EngineRole.PREFILL)
    status, info = get_json(front.url, "/server_info")
    assert status == 200
    assert info["port"] == front.port and info["host"] == "127.0.0.1"
    assert info["disaggregation_mode"] == "prefill" and info["disaggregation_bootstrap_port"] == 18998
    assert info["max_context_length"] == 256 and info["max_running_requests"] == 8
    assert info["internal_states"] == [{}] and info["version"] == "0.1.0"
    status, alias = get_json(front.url, "/get_server_info")
    assert status == 200 and alias == info


def test_models_card(serve, checkpoint_dir):
    front = serve()
    status, models = get_json(front.url, "/v1/models")
    assert status == 200 and models["object"] == "list"
    card = models["data"][0]
    assert (card["id"], card["object"], card["root"], card["max_model_len"]) == ("tiny", "model", str(checkpoint_dir), 256)


def test_metrics_count_requests_and_tokens(serve):
    front = serve()
    assert post_json(front.url, "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 3}})[0] == 200
    get(front.url, "/health_generate")  # probes are not counted
    status, headers, data = get(front.url, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    values = {(s.name, s.labels.get("finish_reason"), s.labels.get("is_streaming")): s.value
              for family in text_string_to_metric_families(data.decode()) for s in family.samples}
    assert values[("sglang:prompt_tokens_total", None, None)] == 2
    assert values[("sglang:generation_tokens_total", None, None)] == 3
    assert values[("sglang:num_requests_total", "length", None)] == 1
    assert values[("sglang:time_to_first_token_seconds_count", None, "false")] == 1
    assert values[("sglang:inter_token_latency_seconds_count", None, None)] == 2
    assert values[("sglang:e2e_request_latency_seconds_count", None, None)] == 1
    assert values[("sglang:num_running_reqs", None, None)] == 1  # the fake engine's last report (the probe)


def test_abort_request_route(serve):
    front = serve(token_delay_s=0.05)
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    conn.request("POST", "/generate", json.dumps({"text": "ab", "rid": "long", "sampling_params": {
        "max_new_tokens": 200, "ignore_eos": True}}), {"Content-Type": "application/json"})
    wait_until(lambda: front.engine.requests, what="request admitted")
    assert post_json(front.url, "/abort_request", {"rid": "long"})[0] == 200
    body = json.loads(conn.getresponse().read())
    conn.close()
    assert body["meta_info"]["finish_reason"] == {"type": "abort", "message": "Aborted"}
    assert front.engine.aborted == ["long"]
    status, error = post_json(front.url, "/abort_request", {})
    assert status == 400 and "abort_request needs a rid string or abort_all: true" in error["error"]["message"]


def test_an_engine_bug_is_a_json_500_and_the_server_keeps_serving(serve):
    front = serve()
    front.engine.refuse_with = ZeroDivisionError("division by zero")  # not an EngineError: a bug
    status, body = post_json(front.url, "/generate", {"text": "ab"})
    assert status == 500
    assert body["error"]["message"] == "internal error: ZeroDivisionError('division by zero')"
    status, _, events = post_sse(front.url, "/generate", {"text": "ab", "stream": True})
    assert status == 500 and events[0]["error"]["message"] == "internal error: ZeroDivisionError('division by zero')"
    bug_rids = [r.rid for r in front.engine.requests]
    assert front.engine.aborted == bug_rids  # the engine may still hold them: abort to be safe
    front.engine.refuse_with = None
    assert post_json(front.url, "/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 1}})[0] == 200


def test_grpc_probe_errors_are_dropped_from_aiohttp_logs():
    from aiohttp.http_exceptions import BadHttpMessage

    from sglang_asym.runtime.http.server import _GrpcProbeFilter

    def record(exc):
        return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request", None,
                                 (type(exc), exc, None) if exc else None)

    probe_filter = _GrpcProbeFilter()
    assert not probe_filter.filter(record(BadHttpMessage("Pause on PRI/Upgrade")))
    assert probe_filter.filter(record(BadHttpMessage("Invalid method")))
    assert probe_filter.filter(record(ValueError("PRI")))
    assert probe_filter.filter(record(None))
