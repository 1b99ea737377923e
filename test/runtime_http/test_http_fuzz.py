"""Fuzzing the HTTP front's request parsing (hypothesis): any body, raw bytes or JSON with the routes' own keys
holding any values, gets a 2xx or a 4xx with a JSON error message from a real aiohttp server, never a 5xx, a
dropped connection or a hang (every call is bounded by the client's timeout)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_asym.runtime.engine_api import EngineRole
from sglang_asym.runtime.http import HttpServerConfig
from sglang_asym.runtime.http.sampling import KNOWN_KEYS

from .fakes import FakeEngine
from .harness import request

pytestmark = pytest.mark.timeout(300)
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions", "/abort_request")

scalars = (st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.integers(-3, 300)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
token_ids = st.lists(st.integers(-2, 600), max_size=6) | st.lists(st.lists(st.integers(0, 300), max_size=3), max_size=3)
sampling = st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=6), json_values, max_size=4)
messages = st.lists(st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "system", "assistant",
                                                                                  "tool", ""]) | json_values,
                                                        "content": st.text(max_size=8) | json_values}), max_size=3)

COMMON = {"stream": json_values | st.booleans(), "rid": json_values, "bootstrap_host": json_values,
          "bootstrap_port": json_values, "bootstrap_room": json_values}
BODIES = {
    "/generate": st.fixed_dictionaries({}, optional={
        **COMMON, "text": st.text(max_size=10) | json_values, "input_ids": token_ids | json_values,
        "sampling_params": sampling | json_values, "return_logprob": json_values}),
    "/v1/completions": st.fixed_dictionaries({}, optional={
        **COMMON, "model": st.just("tiny") | json_values, "prompt": st.text(max_size=10) | token_ids | json_values,
        "max_tokens": st.integers(-2, 400) | json_values, "temperature": json_values, "n": json_values,
        "stop": json_values, "stream_options": json_values, "echo": json_values, "best_of": json_values}),
    "/v1/chat/completions": st.fixed_dictionaries({}, optional={
        **COMMON, "model": st.just("tiny") | json_values, "messages": messages | json_values,
        "max_tokens": st.integers(-2, 400) | json_values, "max_completion_tokens": json_values,
        "stream_options": json_values, "tools": json_values}),
    "/abort_request": st.fixed_dictionaries({}, optional={"rid": json_values, "abort_all": json_values}),
}


@pytest.fixture(scope="module")
def front(loop_thread, tokenizer, checkpoint_dir):
    config = HttpServerConfig(model_path=str(checkpoint_dir), served_model_name="tiny", port=0)
    served = loop_thread.serve(FakeEngine(tokenizer, EngineRole.COLOCATED, name="tiny"), tokenizer, config)
    yield served
    loop_thread.call(served.server.stop())


def _check_answer(front, path: str, raw: bytes) -> None:
    status, headers, data = request(front.url, "POST", path, raw=raw)
    assert status < 500, (path, raw[:200], status, data[:300])
    if status >= 400:
        body = json.loads(data)
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
        assert isinstance(message, str) and message, body
    elif headers.get("content-type", "").startswith("text/event-stream"):
        assert data.endswith(b"\n\n"), data[-80:]


@pytest.mark.parametrize("path", ROUTES)
@FUZZ
@given(raw=st.binary(max_size=64) | st.text(max_size=32).map(str.encode))
def test_any_bytes_get_a_client_error_or_an_answer(front, path, raw):
    _check_answer(front, path, raw)


@pytest.mark.parametrize("path", ROUTES)
@FUZZ
@given(value=json_values)
def test_any_json_value_gets_a_client_error_or_an_answer(front, path, value):
    _check_answer(front, path, json.dumps(value).encode())


@pytest.mark.parametrize("path", ROUTES)
@FUZZ
@given(data=st.data())
def test_route_keys_with_any_values_get_a_client_error_or_an_answer(front, path, data):
    body = data.draw(BODIES[path])
    _check_answer(front, path, json.dumps(body).encode())
