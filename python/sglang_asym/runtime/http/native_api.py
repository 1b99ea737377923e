"""`POST /generate`: SGLang's native generate API (text or input_ids, single or batch, JSON or SSE).

Response fields as SGLang's: `text`, `output_ids`, `meta_info {id, finish_reason, prompt_tokens,
completion_tokens, cached_tokens, e2e_latency, ...}`; a batch answers a list, a batch stream tags each
chunk with `index`. Streams are cumulative (SGLang's default): each chunk carries all text so far.
Unknown top-level keys are ignored (the routers add their own); SGLang features this runtime does
not implement are refused by name when they are switched on.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from http import HTTPStatus
from typing import Any

from aiohttp import web

from sglang_asym.runtime.http.errors import ApiError, native_error_response, stream_error_event
from sglang_asym.runtime.http.fields import parse_bootstraps, parse_rids, per_item
from sglang_asym.runtime.http.runner import AdmittedRequest, RequestRunner, RequestState
from sglang_asym.runtime.http.sampling import parse_sampling
from sglang_asym.runtime.http.streams import (
    finish_event_stream,
    interleave,
    open_event_stream,
    run_all,
    send_event,
)

RUNNER_KEY = web.AppKey("runner", RequestRunner)
_UNSUPPORTED_WHEN_SET = ("return_logprob", "return_hidden_states", "return_routed_experts", "image_data",
                         "video_data", "audio_data", "input_embeds", "lora_path", "session_params",
                         "custom_logit_processor")


async def read_json_object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError.bad_request(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError.bad_request(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def check_token_ids(ids: Any, vocab_size: int, where: str) -> list[int]:
    if not isinstance(ids, list) or not ids:
        raise ApiError.bad_request(f"{where} must be a non-empty list of token ids", param=where)
    for token_id in ids:
        if not isinstance(token_id, int) or isinstance(token_id, bool) or not 0 <= token_id < vocab_size:
            raise ApiError.bad_request(f"{where} holds {token_id!r}, not a token id in [0, {vocab_size})",
                                       param=where)
    return ids


def _prompts(body: dict[str, Any], runner: RequestRunner) -> tuple[list[list[int]], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise ApiError.bad_request("exactly one of text and input_ids must be given")
    vocab = runner.tokenizer.vocab_size
    if input_ids is not None:
        batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        items = input_ids if batch else [input_ids]
        return [check_token_ids(ids, vocab, "input_ids") for ids in items], batch
    batch = isinstance(text, list)
    texts = text if batch else [text]
    if batch and not texts:
        raise ApiError.bad_request("text is an empty list", param="text")
    prompts = []
    for item in texts:
        if not isinstance(item, str):
            raise ApiError.bad_request(f"text must be a string or a list of strings, got {item!r}", param="text")
        if not item:
            raise ApiError.bad_request("text is empty", param="text")
        prompts.append(runner.tokenizer.encode(item))
    return prompts, batch


def parse_generate(body: dict[str, Any], runner: RequestRunner) -> tuple[list[AdmittedRequest], bool, bool]:
    """-> (admitted requests, is_batch, stream)."""
    for key in _UNSUPPORTED_WHEN_SET:
        if body.get(key):
            raise ApiError.bad_request(f"{key} is not supported by this runtime", param=key)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError.bad_request(f"stream must be a boolean, got {stream!r}", param="stream")
    prompts, batch = _prompts(body, runner)
    n = len(prompts)
    samplings = [parse_sampling(s) for s in per_item(body, "sampling_params", n, batch)]
    rids, bootstraps = parse_rids(body, n, batch), parse_bootstraps(body, n, batch)
    admitted = [runner.admit(rid, ids, sampling, stream, bootstrap)
                for rid, ids, sampling, bootstrap in zip(rids, prompts, samplings, bootstraps)]
    return admitted, batch, stream


def native_result(state: RequestState, index: int | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"text": state.text, "output_ids": list(state.output_ids), "meta_info": state.meta_info()}
    if index is not None:
        result["index"] = index
    return result


def _failed(state: RequestState) -> ApiError | None:
    return ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, state.error) if state.error is not None else None


async def handle_generate(request: web.Request) -> web.StreamResponse:
    runner = request.app[RUNNER_KEY]
    try:
        admitted, batch, stream = parse_generate(await read_json_object(request), runner)
        if not stream:
            states = await run_all([runner.run(a) for a in admitted])
            failure = next((f for f in map(_failed, states) if f is not None), None)
            if failure is not None:
                raise failure
            results = [native_result(s) for s in states]
            return web.json_response(results if batch else results[0])
    except ApiError as err:
        return native_error_response(err)
    return await _stream(request, runner, admitted, batch)


async def _stream(request: web.Request, runner: RequestRunner, admitted: list[AdmittedRequest],
                  batch: bool) -> web.StreamResponse:
    response: web.StreamResponse | None = None
    try:
        async with aclosing(interleave([runner.run(a) for a in admitted])) as progress:
            try:
                item: tuple[int, RequestState] | None = await anext(progress)  # refusals surface here, before the 200
            except ApiError as err:
                return native_error_response(err)
            response = await open_event_stream(request)
            while item is not None:
                index, state = item
                if state.error is not None:
                    await send_event(response, stream_error_event(state.error))
                    break
                await send_event(response, native_result(state, index if batch else None))
                try:
                    item = await anext(progress, None)
                except ApiError as err:
                    await send_event(response, stream_error_event(err))
                    break
            await finish_event_stream(response)
    except ConnectionResetError:
        pass  # the client went away mid-stream; closing `progress` aborted its requests
    return response
