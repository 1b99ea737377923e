"""The aiohttp application of the SGLang-compatible front, and ways to serve it.

Handlers are cancelled when the client disconnects (aiohttp's `handler_cancellation`), which is how a
client that goes away mid-request reaches `engine.abort(rid)`. The app serves no `/version`: smg takes
a worker that answers it for vLLM and then talks vLLM's PD protocol to it instead of SGLang's.

SIGTERM / SIGINT drain the server: new generate requests get 503 and /health answers 503 (as SGLang's
server does while it exits, so the routers stop sending work), running requests finish for up to
`drain_timeout_s`, what is left is aborted (its clients see finish_reason `abort`, not a stream that just
stops), then the server closes. It keeps listening meanwhile, so a router's pooled connection gets a clear
503 rather than a reset.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass
from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from sglang_asym.runtime.engine_api import EngineClient
from sglang_asym.runtime.http.config import HttpServerConfig
from sglang_asym.runtime.http.errors import ApiError, native_error_response
from sglang_asym.runtime.http.info_api import CONFIG_KEY, add_info_routes
from sglang_asym.runtime.http.native_api import RUNNER_KEY, handle_generate
from sglang_asym.runtime.http.openai_api import SERVED_MODEL_KEY, handle_chat_completions, handle_completions
from sglang_asym.runtime.http.runner import RequestRunner
from sglang_asym.runtime.http.tokenizer import TextTokenizer

MAX_REQUEST_BYTES = 64 << 20
ABORTED_FLUSH_S = 5.0  # after the drain, how long aborted requests get to send their last event
_GENERATE_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
_HEALTH_PATHS = frozenset({"/health", "/health_generate"})
logger = logging.getLogger(__name__)


@dataclass
class DrainState:
    draining: bool = False


DRAIN_KEY = web.AppKey("drain", DrainState)


class _GrpcProbeFilter(logging.Filter):
    """The routers first try gRPC on each worker (an HTTP/2 preface) and fall back to HTTP/1.1; aiohttp
    logs every such probe as an error with a traceback. Drop exactly those records."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, BadHttpMessage) and "PRI" in str(exc))


def _install_probe_filter() -> None:
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _GrpcProbeFilter) for f in logger.filters):
        logger.addFilter(_GrpcProbeFilter())


@web.middleware
async def _json_internal_errors(request: web.Request, handler):
    """A bug in a handler still answers JSON (and is logged with its traceback); the server keeps serving."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:
        logger.exception("unhandled error serving %s %s", request.method, request.path)
        return native_error_response(ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {exc!r}"))


@web.middleware
async def _refuse_while_draining(request: web.Request, handler):
    """While the server drains, no new request is admitted and the routers see it unhealthy."""
    if request.app[DRAIN_KEY].draining:
        if request.path in _HEALTH_PATHS:
            return web.Response(status=HTTPStatus.SERVICE_UNAVAILABLE)
        if request.path in _GENERATE_PATHS:
            return native_error_response(ApiError(HTTPStatus.SERVICE_UNAVAILABLE,
                                                  "the server is shutting down: no new requests are admitted"))
    return await handler(request)


def build_app(engine: EngineClient, tokenizer: TextTokenizer, config: HttpServerConfig) -> web.Application:
    _install_probe_filter()
    app = web.Application(client_max_size=MAX_REQUEST_BYTES,
                          middlewares=[_refuse_while_draining, _json_internal_errors])
    app[DRAIN_KEY] = DrainState()
    app[RUNNER_KEY] = RequestRunner(engine, tokenizer)
    app[CONFIG_KEY] = config
    app[SERVED_MODEL_KEY] = config.served_name
    for method in ("POST", "PUT"):
        app.router.add_route(method, "/generate", handle_generate)
    app.router.add_post("/v1/completions", handle_completions)
    app.router.add_post("/v1/chat/completions", handle_chat_completions)
    add_info_routes(app)
    return app


class HttpServer:
    """Serves an app on the running event loop: `await start()`, `url`, `await stop()`."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0,
                 shutdown_timeout_s: float = 5.0) -> None:
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=shutdown_timeout_s)
        self._host, self._port = host, port
        self.port: int | None = None

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("HttpServer is not started")
        return f"http://{self._host}:{self.port}"

    async def drain(self, timeout_s: float) -> tuple[str, ...]:
        """The SIGTERM path without the signal: stop admitting, wait, abort the rest (-> the aborted rids)."""
        return await drain(self._runner.app, timeout_s)

    async def stop(self) -> None:
        if self.port is None:
            return
        self.port = None
        await self._runner.cleanup()


async def _wait_idle(runner: RequestRunner, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while runner.live_rids():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def drain(app: web.Application, timeout_s: float) -> tuple[str, ...]:
    """Stop admitting, let running requests finish for up to timeout_s, abort the rest; -> the aborted rids."""
    app[DRAIN_KEY].draining = True
    runner = app[RUNNER_KEY]
    if await _wait_idle(runner, timeout_s):
        return ()
    left = runner.live_rids()
    logger.warning("drain: %d request(s) still running after %.1f s, aborting them", len(left), timeout_s)
    for rid in left:
        await runner.engine.abort(rid)
    await _wait_idle(runner, ABORTED_FLUSH_S)
    return left


async def serve_until_signal(app: web.Application, config: HttpServerConfig) -> None:
    """Serve until SIGINT/SIGTERM, then drain (see the module docstring) and close."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=ABORTED_FLUSH_S)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        logger.warning("shutting down: draining for up to %.1f s", config.drain_timeout_s)
        await drain(app, config.drain_timeout_s)
    finally:
        await runner.cleanup()


def run_http_server(engine: EngineClient, tokenizer: TextTokenizer, config: HttpServerConfig) -> None:
    """Blocking: serve until SIGINT/SIGTERM, drain, return (the launch CLI's entry)."""
    asyncio.run(serve_until_signal(build_app(engine, tokenizer, config), config))
