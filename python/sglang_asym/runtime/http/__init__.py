"""SGLang-compatible HTTP front of the embedded runtime: /generate, /v1/completions, /v1/chat/completions,
health/info/metrics routes, in front of any `engine_api.EngineClient`."""

from sglang_asym.runtime.http.config import HttpServerConfig
from sglang_asym.runtime.http.server import HttpServer, build_app, run_http_server
from sglang_asym.runtime.http.tokenizer import TextTokenizer

__all__ = ["HttpServer", "HttpServerConfig", "TextTokenizer", "build_app", "run_http_server"]
