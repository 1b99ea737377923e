"""POST /generate end to end against FakeEngine: SGLang's response fields, streams, batches, bad input."""

from __future__ import annotations

import http.client
import json

import pytest

from sglang_asym.runtime.engine_api import EngineOverloadedError, EngineRole, PromptTooLongError

from .fakes import REPLY
from .harness import get, post_json, post_sse, wait_until


def reply_ids(front, prompt_len):
    return front.engine.reply_ids(prompt_len)


def test_text_generate_returns_sglang_fields(serve, tokenizer):
    front = serve()
    prompt = "hello world"
    prompt_len = len(tokenizer.encode(prompt))
    status, body = post_json(front.url, "/generate", {"text": prompt, "rid": "r-1",
                                                      "sampling_params": {"max_new_tokens": 64, "temperature": 0}})
    assert status == 200
    expected_ids = [*reply_ids(front, prompt_len), 1]
    assert body["text"] == f"{prompt_len}:{REPLY}"  # EOS kept in output_ids, trimmed from the text
    assert body["output_ids"] == expected_ids
    meta = body["meta_info"]
    assert meta["id"] == "r-1"
    assert meta["finish_reason"] == {"type": "stop", "matched": 1}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (prompt_len, len(expected_ids), 0)
    assert meta["e2e_latency"] >= 0
    req = front.engine.requests[-1]
    assert req.rid == "r-1" and req.input_ids == tuple(tokenizer.encode(prompt)) and req.bootstrap is None
    assert req.sampling.max_new_tokens == 64 and req.sampling.temperature == 0 and req.stream is False


def test_input_ids_length_limit_and_no_stop_trim(serve):
    front = serve()
    status, body = post_json(front.url, "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}})
    assert status == 200
    assert body["output_ids"] == reply_ids(front, 3)[:3]
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    status, body = post_json(front.url, "/generate", {"input_ids": [5], "sampling_params": {
        "max_new_tokens": 50, "no_stop_trim": True, "skip_special_tokens": False}})
    assert body["text"] == f"1:{REPLY}<|eos|>"


def test_stop_token_ids_finish_with_matched(serve):
    front = serve()
    ids = reply_ids(front, 2)
    status, body = post_json(front.url, "/generate", {"input_ids": [5, 6], "sampling_params": {
        "max_new_tokens": 50, "stop_token_ids": [ids[2]]}})
    assert body["output_ids"] == ids[:3]
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[2]}
    assert body["text"] == "2:"  # the matched stop token is not part of the text


def test_stream_chunks_are_cumulative_and_end_with_done(serve, tokenizer):
    front = serve(tokens_per_event=2)
    status, content_type, events = post_sse(front.url, "/generate", {"input_ids": [9, 9, 9, 9], "stream": True,
                                                                      "rid": "s-1", "sampling_params": {"max_new_tokens": 64}})
    assert status == 200 and content_type.startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    full_ids = [*reply_ids(front, 4), 1]
    for i, chunk in enumerate(chunks[:-1]):
        assert chunk["output_ids"] == full_ids[:2 * (i + 1)]
        assert chunk["meta_info"]["finish_reason"] is None and chunk["meta_info"]["id"] == "s-1"
        assert chunk["text"] == tokenizer.decode(chunk["output_ids"])[:len(chunk["text"])]
    assert chunks[-1]["output_ids"] == full_ids and chunks[-1]["text"] == f"4:{REPLY}"
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": 1}
    assert "\ufffd" not in "".join(c["text"] for c in chunks)


def test_batch_generate_and_batch_stream(serve):
    front = serve()
    body = {"input_ids": [[1, 2], [3, 4, 5]], "rid": ["a", "b"],
            "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 3}]}
    status, results = post_json(front.url, "/generate", body)
    assert status == 200 and [r["meta_info"]["id"] for r in results] == ["a", "b"]
    assert results[0]["output_ids"] == reply_ids(front, 2)[:2]
    assert results[1]["output_ids"] == reply_ids(front, 3)[:3]
    status, _, events = post_sse(front.url, "/generate", {**body, "rid": ["c", "d"], "stream": True})
    finals = {e["index"]: e for e in events[:-1] if e["meta_info"]["finish_reason"]}
    assert finals[0]["meta_info"]["id"] == "c" and finals[0]["output_ids"] == reply_ids(front, 2)[:2]
    assert finals[1]["meta_info"]["id"] == "d" and finals[1]["output_ids"] == reply_ids(front, 3)[:3]
    assert events[-1] == "[DONE]"


def test_one_rid_for_a_text_batch_is_made_distinct(serve):
    front = serve()
    status, results = post_json(front.url, "/generate", {"text": ["ab", "hello"], "rid": "x",
                                                         "sampling_params": {"max_new_tokens": 1}})
    assert status == 200 and [r["meta_info"]["id"] for r in results] == ["x_0", "x_1"]


@pytest.mark.parametrize("body, status, message", [
    ({}, 400, "exactly one of text and input_ids must be given"),
    ({"text": "a", "input_ids": [1]}, 400, "exactly one of text and input_ids must be given"),
    ({"text": ""}, 400, "text is empty"),
    ({"text": 5}, 400, "text must be a string or a list of strings, got 5"),
    ({"input_ids": []}, 400, "input_ids must be a non-empty list of token ids"),
    ({"input_ids": [1, 300]}, 400, "input_ids holds 300, not a token id in [0, 300)"),
    ({"input_ids": list(range(1, 200)) * 2}, 400, "The input (398 tokens) is longer than the model's context length (256 tokens)."),
    ({"input_ids": [1] * 200, "sampling_params": {"max_new_tokens": 100}}, 400,
     "You requested a total of 300 tokens: 200 tokens from the input and 100 tokens for the completion"),
    ({"text": "a", "sampling_params": {"max_new_tokens": -5}}, 400, "max_new_tokens must be in [0, 1048576], got -5"),
    ({"text": "a", "sampling_params": {"max_new_tokens": 1 << 40}}, 400, "max_new_tokens must be in [0, 1048576]"),
    ({"text": "a", "sampling_params": {"best_of": 2}}, 400, "unknown field `best_of`"),
    ({"text": "a", "return_logprob": True}, 400, "return_logprob is not supported by this runtime"),
    ({"text": "a", "stream": "yes"}, 400, "stream must be a boolean, got 'yes'"),
    ({"text": ["a", "b"], "rid": ["x"]}, 400, "rid has 1 entries but the batch has 2 prompts"),
    ({"text": "a", "bootstrap_room": 5}, 400, "bootstrap_host is required together with the other bootstrap fields"),
    ({"text": "a", "bootstrap_host": "h", "bootstrap_room": -1}, 400, "bootstrap_room must be an integer in [0, 2^63)"),
])
def test_bad_requests_are_400_and_the_server_keeps_serving(serve, body, status, message):
    front = serve()
    got_status, got = post_json(front.url, "/generate", body)
    assert got_status == status, got
    assert message in got["error"]["message"]
    assert got["error"]["code"] == status and got["error"]["type"] == "BadRequestError"
    assert front.engine.requests == []
    assert post_json(front.url, "/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 1}})[0] == 200


@pytest.mark.parametrize("raw, message", [
    (b"{not json", "request body is not valid JSON"),
    (b"[1, 2]", "request body must be a JSON object, got list"),
    (b"\xff\xfe", "request body is not valid JSON"),
])
def test_malformed_bodies_are_400(serve, raw, message):
    front = serve()
    status, body = post_json(front.url, "/generate", raw=raw)
    assert status == 400 and message in body["error"]["message"]


@pytest.mark.parametrize("role", [EngineRole.PREFILL, EngineRole.DECODE])
def test_disaggregated_roles_require_bootstrap_fields(serve, role):
    front = serve(role=role)
    status, body = post_json(front.url, "/generate", {"text": "ab"})
    assert status == 400
    assert body["error"]["message"].startswith(f"this server runs the {role.value} role of a disaggregated pair")


def test_prefill_role_answers_an_empty_well_formed_response(serve):
    front = serve(role=EngineRole.PREFILL, transfer_delay_s=0.01)
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 123}
    status, body = post_json(front.url, "/generate", {"input_ids": [4, 5, 6], "rid": "p1", **boot})
    assert status == 200
    assert body["text"] == "" and body["output_ids"] == []
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert body["meta_info"]["completion_tokens"] == 0 and body["meta_info"]["prompt_tokens"] == 3
    assert body["meta_info"]["transferred_tokens"] == 3  # engine meta is merged into meta_info
    bootstrap = front.engine.requests[-1].bootstrap
    assert (bootstrap.host, bootstrap.port, bootstrap.room) == ("127.0.0.1", 8998, 123)
    status, _, events = post_sse(front.url, "/generate", {"input_ids": [4], "stream": True, **boot, "bootstrap_room": 124})
    assert [e["output_ids"] for e in events[:-1]] == [[]] and events[-1] == "[DONE]"


def test_reused_bootstrap_room_is_409(serve):
    front = serve(role=EngineRole.DECODE)
    body = {"input_ids": [4], "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 77,
            "sampling_params": {"max_new_tokens": 1}}
    assert post_json(front.url, "/generate", body)[0] == 200
    status, error = post_json(front.url, "/generate", body)
    assert status == 409
    assert error["error"] == {"message": "bootstrap_room 77 is already in use", "type": "ConflictError", "code": 409}
    status, _, events = post_sse(front.url, "/generate", {**body, "stream": True})
    assert status == 409  # refused before the stream starts: a real status, not an error chunk


def test_engine_refusals_map_to_statuses(serve):
    front = serve()
    front.engine.refuse_with = PromptTooLongError("prompt of 9 tokens exceeds the prefill budget")
    status, body = post_json(front.url, "/generate", {"text": "ab"})
    assert (status, body["error"]["message"]) == (400, "prompt of 9 tokens exceeds the prefill budget")
    front.engine.refuse_with = EngineOverloadedError("queue full")
    assert post_json(front.url, "/generate", {"text": "ab"})[0] == 503
    assert front.engine.aborted == []  # a refused request is the engine's own decision: no abort


def test_error_after_admission_is_500_or_an_error_chunk(serve):
    front = serve()
    front.engine.fail_after_tokens = 2
    status, body = post_json(front.url, "/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 9}})
    assert (status, body["error"]["message"]) == (500, "decode worker lost")
    status, _, events = post_sse(front.url, "/generate", {"text": "ab", "stream": True})
    assert status == 200 and len(events[-3]["output_ids"]) == 2
    assert events[-2] == {"error": {"message": "decode worker lost", "type": "InternalServerError", "code": 500}}
    assert events[-1] == "[DONE]"


def test_duplicate_running_rid_is_400(serve, loop_thread):
    front = serve(token_delay_s=0.05)
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    conn.request("POST", "/generate", json.dumps({"text": "ab", "rid": "dup", "sampling_params": {"max_new_tokens": 20}}),
                 {"Content-Type": "application/json"})
    wait_until(lambda: any(r.rid == "dup" for r in front.engine.requests), what="first request admitted")
    status, body = post_json(front.url, "/generate", {"text": "ab", "rid": "dup"})
    assert status == 400 and "Duplicate request ID 'dup'" in body["error"]["message"]
    assert conn.getresponse().status == 200
    conn.close()


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_the_request(serve, stream):
    front = serve(token_delay_s=0.05)
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    conn.request("POST", "/generate", json.dumps({"text": "ab", "rid": "gone", "stream": stream,
                                                  "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}),
                 {"Content-Type": "application/json"})
    if stream:
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
    else:
        wait_until(lambda: front.engine.requests, what="request admitted")
    conn.sock.close()
    conn.close()
    wait_until(lambda: "gone" in front.engine.aborted, what="engine.abort('gone')")
    assert front.engine.aborted == ["gone"]
    assert post_json(front.url, "/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 1}})[0] == 200


def test_put_generate_and_no_version_route(serve):
    front = serve()
    from .harness import request
    status, _, data = request(front.url, "PUT", "/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 1}})
    assert status == 200 and json.loads(data)["meta_info"]["completion_tokens"] == 1
    assert get(front.url, "/version")[0] == 404  # smg would take a worker with /version for vLLM
