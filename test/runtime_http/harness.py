"""Serving HTTP fronts from a background event loop, and a small blocking HTTP client for the tests."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import web

from sglang_asym.runtime.http import HttpServer, HttpServerConfig, TextTokenizer, build_app

CALL_TIMEOUT_S = 20.0


@dataclass
class RecordedRequest:
    method: str
    path: str
    body: Any
    response_body: bytes | None = None  # for non-streamed responses


@dataclass
class ServedFront:
    server: HttpServer
    engine: Any
    recorded: list[RecordedRequest] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    def posts(self, path: str) -> list[RecordedRequest]:
        return [r for r in self.recorded if r.method == "POST" and r.path == path]

    def reset(self) -> None:
        """Forget recorded traffic and restore the engine's default behaviour."""
        self.recorded.clear()
        engine = self.engine
        engine.requests.clear()
        engine.aborted.clear()
        engine.refuse_with, engine.refuse_after_s, engine.fail_after_tokens, engine.token_delay_s = None, 0.0, None, 0.0


class LoopThread:
    """An asyncio loop in a daemon thread; `call(coro)` runs a coroutine there and waits (bounded)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="http-test-loop", daemon=True)
        self._thread.start()
        self._fronts: list[ServedFront] = []

    def call(self, coro, timeout_s: float = CALL_TIMEOUT_S):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call_soon(self, coro) -> concurrent.futures.Future:
        """Start a coroutine on the loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def serve(self, engine, tokenizer: TextTokenizer, config: HttpServerConfig) -> ServedFront:
        recorded: list[RecordedRequest] = []

        @web.middleware
        async def record(request: web.Request, handler: Callable):
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:  # not JSON, or not text at all: recorded as the raw bytes
                body = raw
            entry = RecordedRequest(request.method, request.path, body)
            recorded.append(entry)
            response = await handler(request)
            if isinstance(response, web.Response):
                entry.response_body = response.body
            return response

        async def start() -> HttpServer:
            app = build_app(engine, tokenizer, config)
            app.middlewares.append(record)
            server = HttpServer(app, config.host, config.port, shutdown_timeout_s=1.0)
            await server.start()
            return server

        front = ServedFront(self.call(start()), engine, recorded)
        self._fronts.append(front)
        return front

    def close(self) -> None:
        for front in self._fronts:
            self.call(front.server.stop())
        self._fronts.clear()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _connection(url: str, timeout_s: float) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout_s)


def request(url: str, method: str, path: str, body: Any = None, raw: bytes | None = None,
            timeout_s: float = CALL_TIMEOUT_S) -> tuple[int, dict[str, str], bytes]:
    conn = _connection(url, timeout_s)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def post_json(url: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    status, _, data = request(url, "POST", path, body, raw)
    return status, json.loads(data) if data else None


def get(url: str, path: str) -> tuple[int, dict[str, str], bytes]:
    return request(url, "GET", path)


def parse_sse(data: bytes) -> list[Any]:
    """`data:` payloads in order; '[DONE]' stays a string. Asserts SSE framing."""
    text = data.decode()
    assert text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-40:]!r}"
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), f"not an SSE data event: {block!r}"
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def post_sse(url: str, path: str, body: Any) -> tuple[int, str, list[Any]]:
    status, headers, data = request(url, "POST", path, body)
    if status != 200:
        return status, headers.get("content-type", ""), [json.loads(data)]
    return status, headers.get("content-type", ""), parse_sse(data)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 120.0, what: str = "condition") -> None:
    # generous: these tests share the 2 cores with the system tests' servers (two xdist workers)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)
