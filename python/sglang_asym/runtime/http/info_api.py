"""Health, info, metrics and control routes, with SGLang's names and field names.

`/health` asks the engine whether it is alive (cheap: the routers poll it). `/health_generate` runs a
one-token greedy probe through the engine (PD roles mark it with SGLang's fake bootstrap host) and
answers 503 if it does not finish within the configured timeout.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from aiohttp import web

import sglang_asym
from sglang_asym.runtime.engine_api import FAKE_BOOTSTRAP_HOST, BootstrapInfo, GenerateRequest, SamplingParams
from sglang_asym.runtime.http.config import HttpServerConfig
from sglang_asym.runtime.http.errors import ApiError, native_error_response
from sglang_asym.runtime.http.native_api import RUNNER_KEY, read_json_object
from sglang_asym.runtime.http.runner import AdmittedRequest, RequestRunner
from sglang_asym.runtime.http.streams import last_item

CONFIG_KEY = web.AppKey("config", HttpServerConfig)
STARTED_KEY = web.AppKey("started", float)
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"


def _runner(request: web.Request) -> RequestRunner:
    return request.app[RUNNER_KEY]


async def handle_health(request: web.Request) -> web.Response:
    return web.Response(status=200 if _runner(request).engine.health() else 503)


async def handle_health_generate(request: web.Request) -> web.Response:
    runner, config = _runner(request), request.app[CONFIG_KEY]
    engine = runner.engine
    if not engine.health():
        return web.Response(status=503)
    bootstrap = BootstrapInfo(FAKE_BOOTSTRAP_HOST, None, 0) if engine.role.requires_bootstrap else None
    probe = GenerateRequest(f"{HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}", (0,),
                            SamplingParams(max_new_tokens=1, temperature=0.0), False, bootstrap)
    try:
        async with asyncio.timeout(config.health_generate_timeout_s):
            state = await last_item(runner.run(AdmittedRequest(probe, log_metrics=False)))
    except (ApiError, TimeoutError):
        return web.Response(status=503)
    return web.Response(status=503 if state.error is not None else 200)


def model_info(request: web.Request) -> dict[str, Any]:
    config, engine = request.app[CONFIG_KEY], _runner(request).engine
    info: dict[str, Any] = {
        "model_path": config.model_path,
        "served_model_name": config.served_name,
        "tokenizer_path": config.tokenizer_dir,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "disaggregation_mode": engine.role.value,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": None,
        "architectures": None,
    }
    info.update(engine.model_info())
    return info


def server_info(request: web.Request) -> dict[str, Any]:
    config, engine = request.app[CONFIG_KEY], _runner(request).engine
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    host, port = sockname[:2] if sockname else (config.host, config.port)  # the bound port, also for port 0
    info: dict[str, Any] = {
        "model_path": config.model_path,
        "served_model_name": config.served_name,
        "tokenizer_path": config.tokenizer_dir,
        "host": host,
        "port": port,
        "disaggregation_mode": engine.role.value,
        "max_context_length": engine.max_context_length,
        "context_length": engine.max_context_length,
        "startup_time": request.app[STARTED_KEY],
        "version": sglang_asym.__version__,
        "frontend": "sglang_asym",
        "internal_states": [{}],
    }
    info.update(engine.server_info())
    return info


async def handle_model_info(request: web.Request) -> web.Response:
    return web.json_response(model_info(request))


async def handle_server_info(request: web.Request) -> web.Response:
    return web.json_response(server_info(request))


async def handle_models(request: web.Request) -> web.Response:
    config, engine = request.app[CONFIG_KEY], _runner(request).engine
    card = {"id": config.served_name, "object": "model", "created": int(request.app[STARTED_KEY]),
            "owned_by": "sglang", "root": config.model_path, "parent": None,
            "max_model_len": engine.max_context_length}
    return web.json_response({"object": "list", "data": [card]})


async def handle_metrics(request: web.Request) -> web.Response:
    metrics = _runner(request).engine.metrics
    return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})


async def handle_abort_request(request: web.Request) -> web.Response:
    """SGLang's `/abort_request {rid, abort_all}`."""
    runner = _runner(request)
    try:
        body = await read_json_object(request)
        rid, abort_all = body.get("rid", ""), body.get("abort_all", False)
        if not isinstance(abort_all, bool) or not isinstance(rid, str) or (not rid and not abort_all):
            raise ApiError.bad_request("abort_request needs a rid string or abort_all: true")
    except ApiError as err:
        return native_error_response(err)
    for target in runner.live_rids() if abort_all else (rid,):
        await runner.engine.abort(target)
    return web.Response(status=200)


def add_info_routes(app: web.Application) -> None:
    app[STARTED_KEY] = time.time()
    app.router.add_get("/health", handle_health)
    app.router.add_get("/health_generate", handle_health_generate)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, handle_model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, handle_server_info)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_post("/abort_request", handle_abort_request)
