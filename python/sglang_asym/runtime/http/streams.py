"""Helpers over progress streams: SSE framing, run-to-end, and fan-in of a batch.

`interleave` pulls the next item of a stream only after the consumer has handled its previous one,
so a yielded `RequestState` does not change while the consumer reads it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, TypeVar

from aiohttp import web

from sglang_asym.runtime.http.errors import ApiError

T = TypeVar("T")
SSE_DONE = b"data: [DONE]\n\n"


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


async def open_event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def send_event(response: web.StreamResponse, payload: Any) -> None:
    await response.write(b"data: " + dumps(payload) + b"\n\n")


async def finish_event_stream(response: web.StreamResponse) -> web.StreamResponse:
    await response.write(SSE_DONE)
    await response.write_eof()
    return response


async def last_item(stream: AsyncIterator[T]) -> T:
    item = None
    async for item in stream:
        pass
    if item is None:
        raise RuntimeError("progress stream ended without any item")
    return item


async def run_all(streams: list[AsyncIterator[T]]) -> list[T]:
    """Every stream to its end, concurrently; the first failure cancels the rest and is raised."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(last_item(s)) for s in streams]
    except BaseExceptionGroup as group_error:  # report one error, an ApiError if any, not the group
        errors = group_error.exceptions
        raise next((e for e in errors if isinstance(e, ApiError)), errors[0]) from group_error
    return [t.result() for t in tasks]


async def interleave(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(index, item) pairs from several streams in arrival order."""
    pending = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                yield index, item
                pending[asyncio.ensure_future(anext(streams[index]))] = index
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)
