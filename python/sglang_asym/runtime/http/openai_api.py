"""`POST /v1/completions`, `POST /v1/chat/completions`: OpenAI-compatible JSON and SSE chunks.

Shapes follow SGLang's OpenAI protocol: `id` is the request id, choices carry `finish_reason`
("stop" / "length" / "abort") and SGLang's `matched_stop`; streams send text deltas (chat: a first
chunk with the assistant role, content deltas, a final chunk with the finish reason), an optional
usage chunk (`stream_options.include_usage`), then `data: [DONE]`.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from http import HTTPStatus
from typing import Any, Callable

from aiohttp import web

from sglang_asym.runtime.engine_api import FinishKind
from sglang_asym.runtime.http.errors import ApiError, openai_error_response
from sglang_asym.runtime.http.native_api import RUNNER_KEY, read_json_object
from sglang_asym.runtime.http.openai_parse import OpenAIJob, parse_chat, parse_completion
from sglang_asym.runtime.http.runner import RequestRunner, RequestState
from sglang_asym.runtime.http.streams import finish_event_stream, interleave, open_event_stream, run_all, send_event

SERVED_MODEL_KEY = web.AppKey("served_model_name", str)


def _usage(states: list[RequestState]) -> dict[str, int]:
    prompt = sum(s.prompt_tokens for s in states)
    completion = sum(len(s.output_ids) for s in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finish_fields(state: RequestState) -> dict[str, Any]:
    finish = state.finish
    return {"finish_reason": finish.kind.value if finish else None,
            "matched_stop": finish.matched if finish and finish.kind is FinishKind.STOP else None}


def _envelope(job: OpenAIJob, rid: str, created: int, obj: str) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": created, "model": job.model}


def completion_response(job: OpenAIJob, states: list[RequestState]) -> dict[str, Any]:
    choices = [{"index": i, "text": s.text, "logprobs": None, **_finish_fields(s)} for i, s in enumerate(states)]
    return {**_envelope(job, states[0].rid, int(time.time()), "text_completion"), "choices": choices,
            "usage": _usage(states)}


def chat_response(job: OpenAIJob, states: list[RequestState]) -> dict[str, Any]:
    state = states[0]
    message = {"role": "assistant", "content": state.text, "reasoning_content": None}
    return {**_envelope(job, state.rid, int(time.time()), "chat.completion"),
            "choices": [{"index": 0, "message": message, "logprobs": None, **_finish_fields(state)}],
            "usage": _usage(states)}


def completion_chunks(job: OpenAIJob, index: int, state: RequestState, first: bool, created: int) -> list[dict]:
    if not state.delta_text and not state.finished:
        return []
    choice = {"index": index, "text": state.delta_text, "logprobs": None, **_finish_fields(state)}
    return [{**_envelope(job, state.rid, created, "text_completion"), "choices": [choice]}]


def chat_chunks(job: OpenAIJob, index: int, state: RequestState, first: bool, created: int) -> list[dict]:
    def chunk(delta: dict[str, Any], finish: dict[str, Any] | None = None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None,
                  **(finish or {"finish_reason": None, "matched_stop": None})}
        return {**_envelope(job, state.rid, created, "chat.completion.chunk"), "choices": [choice]}

    chunks = [chunk({"role": "assistant", "content": ""})] if first else []
    if state.delta_text:
        chunks.append(chunk({"content": state.delta_text}))
    if state.finished:
        chunks.append(chunk({}, _finish_fields(state)))
    return chunks


ChunkBuilder = Callable[[OpenAIJob, int, RequestState, bool, int], list[dict]]


async def _serve(request: web.Request, parse, respond, chunks: ChunkBuilder, obj: str) -> web.StreamResponse:
    runner: RequestRunner = request.app[RUNNER_KEY]
    try:
        job = parse(await read_json_object(request), runner, request.app[SERVED_MODEL_KEY])
        if not job.stream:
            states = await run_all([runner.run(a) for a in job.requests])
            failed = next((s for s in states if s.error is not None), None)
            if failed is not None:
                raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, failed.error)
            return web.json_response(respond(job, states))
    except ApiError as err:
        return openai_error_response(err)
    return await _stream(request, runner, job, chunks, obj)


async def _stream(request: web.Request, runner: RequestRunner, job: OpenAIJob, chunks: ChunkBuilder,
                  obj: str) -> web.StreamResponse:
    created = int(time.time())
    latest: dict[int, RequestState] = {}
    response: web.StreamResponse | None = None
    try:
        async with aclosing(interleave([runner.run(a) for a in job.requests])) as progress:
            try:
                item = await anext(progress)  # engine refusals surface here, before the 200 goes out
            except ApiError as err:
                return openai_error_response(err)
            response = await open_event_stream(request)
            while item is not None:
                index, state = item
                if state.error is not None:
                    error = ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, state.error)
                    await send_event(response, {"error": error.openai_body()})
                    break
                for payload in chunks(job, index, state, index not in latest, created):
                    if job.continuous_usage:
                        payload["usage"] = _usage([state])
                    await send_event(response, payload)
                latest[index] = state
                try:
                    item = await anext(progress, None)
                except ApiError as err:
                    await send_event(response, {"error": err.openai_body()})
                    break
            else:
                if job.include_usage:
                    usage_chunk = {**_envelope(job, job.requests[0].engine_request.rid, created, obj),
                                   "choices": [], "usage": _usage(list(latest.values()))}
                    await send_event(response, usage_chunk)
            await finish_event_stream(response)
    except ConnectionResetError:
        pass  # the client went away mid-stream; closing `progress` aborted its requests
    return response


async def handle_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, parse_completion, completion_response, completion_chunks, "text_completion")


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, parse_chat, chat_response, chat_chunks, "chat.completion.chunk")
