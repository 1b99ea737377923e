"""ApiError and the JSON error bodies of the two API families.

Native SGLang routes answer `{"error": {"message": ...}}`; OpenAI routes answer SGLang's
`ErrorResponse` shape `{"object": "error", "message", "type", "param", "code"}`.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from aiohttp import web

from sglang_asym.runtime.engine_api import (
    BootstrapRoomInUseError,
    EngineError,
    EngineOverloadedError,
    RequestRejectedError,
)


class ApiError(Exception):
    """An error the front answers with `status` and a message that names what is wrong."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @classmethod
    def bad_request(cls, message: str, param: str | None = None) -> ApiError:
        return cls(HTTPStatus.BAD_REQUEST, message, param)

    @classmethod
    def from_engine_error(cls, exc: EngineError) -> ApiError:
        if isinstance(exc, BootstrapRoomInUseError):
            status = HTTPStatus.CONFLICT
        elif isinstance(exc, RequestRejectedError):
            status = HTTPStatus.BAD_REQUEST
        elif isinstance(exc, EngineOverloadedError):
            status = HTTPStatus.SERVICE_UNAVAILABLE
        else:
            status = HTTPStatus.INTERNAL_SERVER_ERROR
        return cls(status, str(exc) or type(exc).__name__)

    @property
    def error_type(self) -> str:
        """OpenAI-style error type, e.g. 'BadRequestError' for 400."""
        phrase = HTTPStatus(self.status).phrase.replace(" ", "").replace("-", "")
        return phrase if phrase.endswith("Error") else f"{phrase}Error"

    def native_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "code": int(self.status)}}

    def openai_body(self) -> dict[str, Any]:
        return {"object": "error", "message": self.message, "type": self.error_type, "param": self.param,
                "code": int(self.status)}


def native_error_response(err: ApiError) -> web.Response:
    return web.json_response(err.native_body(), status=err.status)


def openai_error_response(err: ApiError) -> web.Response:
    return web.json_response(err.openai_body(), status=err.status)


def stream_error_event(err: ApiError | str, status: int = HTTPStatus.INTERNAL_SERVER_ERROR) -> dict[str, Any]:
    """The `data:` payload SGLang sends when a stream fails after it started."""
    if isinstance(err, ApiError):
        message, status = err.message, err.status
    else:
        message = err
    return {"error": {"message": message, "type": ApiError(status, message).error_type, "code": int(status)}}
