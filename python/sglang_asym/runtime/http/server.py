"""The aiohttp application of the SGLang-compatible front, and ways to serve it.

Handlers are cancelled when the client disconnects (aiohttp's `handler_cancellation`), which is how a
client that goes away mid-request reaches `engine.abort(rid)`. The app serves no `/version`: smg takes
a worker that answers it for vLLM and then talks vLLM's PD protocol to it instead of SGLang's.
"""

from __future__ import annotations

import logging
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
logger = logging.getLogger(__name__)


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


def build_app(engine: EngineClient, tokenizer: TextTokenizer, config: HttpServerConfig) -> web.Application:
    _install_probe_filter()
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[_json_internal_errors])
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

    async def stop(self) -> None:
        if self.port is None:
            return
        self.port = None
        await self._runner.cleanup()


def run_http_server(engine: EngineClient, tokenizer: TextTokenizer, config: HttpServerConfig) -> None:
    """Blocking: serve until SIGINT/SIGTERM (the launch CLI's entry)."""
    web.run_app(build_app(engine, tokenizer, config), host=config.host, port=config.port,
                handler_cancellation=True, access_log=None, print=None)
