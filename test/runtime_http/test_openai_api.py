"""/v1/completions and /v1/chat/completions against FakeEngine: JSON, SSE chunks, usage, errors."""

from __future__ import annotations

import http.client
import json

import pytest

from sglang_asym.runtime.engine_api import EngineRole
from sglang_asym.runtime.http.chat_template import render_default

from .fakes import BOS, REPLY
from .harness import post_json, post_sse, wait_until


def test_completion_json(serve, tokenizer):
    front = serve()
    prompt_len = len(tokenizer.encode("hello"))
    status, body = post_json(front.url, "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 40,
                                                            "temperature": 0.5, "seed": 3, "rid": "c1"})
    assert status == 200
    assert body["id"] == "c1" and body["object"] == "text_completion" and body["model"] == "tiny"
    assert isinstance(body["created"], int)
    completion = len(front.engine.reply_ids(prompt_len)) + 1
    assert body["choices"] == [{"index": 0, "text": f"{prompt_len}:{REPLY}", "logprobs": None,
                                "finish_reason": "stop", "matched_stop": 1}]
    assert body["usage"] == {"prompt_tokens": prompt_len, "completion_tokens": completion,
                             "total_tokens": prompt_len + completion}
    sampling = front.engine.requests[-1].sampling
    assert (sampling.max_new_tokens, sampling.temperature, sampling.seed) == (40, 0.5, 3)


def test_completion_defaults_to_16_tokens_and_batches_prompts(serve):
    front = serve()
    status, body = post_json(front.url, "/v1/completions", {"prompt": [[5, 6], [7]], "ignore_eos": True})
    assert status == 200
    assert body["model"] == "tiny"  # the served model name when the request names none
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    assert [r.sampling.max_new_tokens for r in front.engine.requests] == [16, 16]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 32, "total_tokens": 35}


def test_completion_stream_deltas_and_usage(serve, tokenizer):
    front = serve()
    status, _, events = post_sse(front.url, "/v1/completions", {
        "prompt": [5, 6, 7], "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}, "rid": "cs"})
    assert status == 200 and events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert all(c["object"] == "text_completion" and c["id"] == "cs" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == tokenizer.decode(front.engine.reply_ids(3)[:4])
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_chat_json_uses_the_default_template(serve, tokenizer):
    front = serve()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    status, body = post_json(front.url, "/v1/chat/completions", {"model": "tiny", "messages": messages,
                                                                 "max_completion_tokens": 50, "rid": "chat-1"})
    assert status == 200
    prompt_ids = tokenizer.encode(render_default(messages, BOS, True), add_special_tokens=False)
    assert front.engine.requests[-1].input_ids == tuple(prompt_ids)
    assert prompt_ids[0] == 0  # the template starts with BOS
    assert body["id"] == "chat-1" and body["object"] == "chat.completion"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": f"{len(prompt_ids)}:{REPLY}",
                                                        "reasoning_content": None},
                                "logprobs": None, "finish_reason": "stop", "matched_stop": 1}]
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)


def test_chat_without_max_tokens_may_fill_the_context(serve):
    front = serve(max_context_length=200)
    status, _ = post_json(front.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    req = front.engine.requests[-1]
    assert status == 200 and req.sampling.max_new_tokens == 200 - len(req.input_ids)


def test_chat_stream_role_deltas_finish_and_usage(serve):
    front = serve(tokens_per_event=3)
    status, _, events = post_sse(front.url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1] if c["choices"])
    prompt_len = len(front.engine.requests[-1].input_ids)
    assert content == f"{prompt_len}:{REPLY}"
    final = chunks[-2]["choices"][0]
    assert final["delta"] == {} and final["finish_reason"] == "stop" and final["matched_stop"] == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == prompt_len


def test_prefill_role_chat_and_completion_are_well_formed_and_empty(serve):
    front = serve(role=EngineRole.PREFILL)
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998}
    status, body = post_json(front.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                                 "bootstrap_room": 1, **boot})
    assert status == 200 and body["choices"][0]["message"]["content"] == ""
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 0
    status, _, events = post_sse(front.url, "/v1/completions", {"prompt": ["a", "b"], "stream": True,
                                                                "bootstrap_room": [2, 3], **boot})
    assert status == 200 and events[-1] == "[DONE]"
    assert sorted(e["choices"][0]["index"] for e in events[:-1]) == [0, 1]
    assert all(e["choices"][0]["text"] == "" and e["choices"][0]["finish_reason"] == "length" for e in events[:-1])
    assert sorted(r.bootstrap.room for r in front.engine.requests[1:]) == [2, 3]


@pytest.mark.parametrize("path, body, message, param", [
    ("/v1/completions", {"prompt": ""}, "prompt is empty", "prompt"),
    ("/v1/completions", {}, "prompt must be a non-empty string", "prompt"),
    ("/v1/completions", {"prompt": "a", "n": 2}, "request.n=2 is not supported by this runtime", "request"),
    ("/v1/completions", {"prompt": "a", "echo": True}, "echo is not supported by this runtime", "echo"),
    ("/v1/completions", {"prompt": "a", "max_tokens": -1}, "request: max_new_tokens must be in [0, 1048576], got -1", "request"),
    ("/v1/completions", {"prompt": "a", "top_p": 2}, "request: top_p must be in (0, 1], got 2", "request"),
    ("/v1/completions", {"prompt": "a", "stop": ["x"]}, "request.stop=['x'] is not supported", "request"),
    ("/v1/chat/completions", {"messages": []}, "messages must be a non-empty list", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True},
     "logprobs is not supported by this runtime", "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
     "Requested token count exceeds the model's maximum context length of 256 tokens", None),
])
def test_openai_errors_use_the_openai_shape(serve, path, body, message, param):
    front = serve()
    status, error = post_json(front.url, path, body)
    assert status == 400
    assert error["object"] == "error" and error["type"] == "BadRequestError" and error["code"] == 400
    assert message in error["message"] and error["param"] == param
    assert front.engine.requests == []


def test_openai_malformed_json_and_stream_error(serve):
    front = serve()
    status, error = post_json(front.url, "/v1/chat/completions", raw=b"{")
    assert status == 400 and error["message"].startswith("request body is not valid JSON")
    front.engine.fail_after_tokens = 1
    status, _, events = post_sse(front.url, "/v1/completions", {"prompt": "a", "stream": True,
                                                                "stream_options": {"include_usage": True}})
    assert events[-2] == {"error": {"object": "error", "message": "decode worker lost", "type": "InternalServerError",
                                    "param": None, "code": 500}}
    assert events[-1] == "[DONE]"


def test_chat_stream_disconnect_aborts(serve):
    front = serve(token_delay_s=0.05)
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps({
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "ignore_eos": True, "stream": True,
        "rid": "chat-gone"}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    conn.sock.close()
    conn.close()
    wait_until(lambda: front.engine.aborted == ["chat-gone"], what="engine.abort('chat-gone')")
