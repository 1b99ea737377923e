"""A request the prefill role refused reaches its client with P's status (a 4xx), not a transfer failure's 500.

Some limits only P knows: SGLang's scheduler refuses a prompt of `max_req_input_len` tokens or more, and
that bound is min(context length, KV pool) - 6 of the server it runs on, so P, whose pool is usually the
smaller, refuses prompts D would take; P's split refuses a prompt it cannot cut. P tells D over the
bootstrap channel (prefill/refusal.py; a batch P ran out of memory on, prefill/out_of_memory.py, with a
503 the same way), and D's decode queues end the request as any failed handshake or
transfer ("Decode handshake failed ... with exception ...", SGLang's decode.py), with a 500.
sglang-router answers a PD request with D's status whenever D's is an error, so the client got a 500 for
its own too-long prompt.

P's relay therefore carries P's status in its words (`relay_reason`, which also holds
room_lifecycle.PREFILL_ABORT_WORDS: D's recompute fallback leaves the room alone), and D's tokenizer
manager answers such an abort with that status and P's words (hooked on
`TokenizerManager._handle_abort_finish_reason`, where SGLang turns a scheduler's abort into the answer): a
ValueError with the status, on a stream too, as for the refusals D makes itself before the first item (SGLang's
HTTP front answers /generate with that status, a /generate stream with an SSE error event of that code, an
OpenAI request or stream with a 400; a 503 keeps its status there too: OpenAIServingBase.create_error_response
AROUND). Only a 4xx and a 503 are taken over: any other failure of P's stays SGLang's 500.

Limits both roles decide alike (the context length, SGLang's tokenizer manager on each side) never get
here: both sides answer those with a 400 before any bootstrap.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any, Callable

from ..cpu_platform.cpu_patch import register_missing
from .room_lifecycle import PREFILL_ABORT_WORDS

HANDLE_ABORT = "sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_abort_finish_reason"
OPENAI_ERROR_RESPONSE = "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.create_error_response"
REFUSED_MESSAGE = "sglang-asym: the prefill worker refused the request: {message}"
# P's own failures that are not the worker's end: it ran out of memory for this batch (prefill/out_of_memory.py)
TAKEN_OVER_5XX = frozenset({HTTPStatus.SERVICE_UNAVAILABLE})
FAILED_MESSAGE = "sglang-asym: the prefill worker could not serve the request: {message}"
FAILED_MESSAGE_START = FAILED_MESSAGE.split("{", 1)[0]
_RELAYED = re.compile(r"sglang-asym: request of room (\d+) refused and " + re.escape(PREFILL_ABORT_WORDS)
                      + r" with HTTP (\d{3}): (.*)\Z", re.DOTALL)


def relay_reason(room: int, status: int, message: str) -> str:
    """The failure reason P sends D for a room it refused with `status`."""
    return (f"sglang-asym: request of room {int(room)} refused and {PREFILL_ABORT_WORDS} with HTTP {int(status)}: "
            f"{message}")


def relayed_refusal(text: str) -> tuple[HTTPStatus, str] | None:
    """P's status and the client's message when `text` (D's abort message, which ends with P's reason)
    relays a refusal of P's with a 4xx status or a failure in TAKEN_OVER_5XX; None otherwise."""
    match = _RELAYED.search(text or "")
    if match is None or not (400 <= int(match.group(2)) < 500 or int(match.group(2)) in TAKEN_OVER_5XX):
        return None
    try:
        status = HTTPStatus(int(match.group(2)))
    except ValueError:  # a 4xx HTTPStatus does not name
        return None
    words = FAILED_MESSAGE if status in TAKEN_OVER_5XX else REFUSED_MESSAGE
    return status, words.format(message=match.group(3))


class RelayedRefusal(ValueError):
    """P's refusal, raised where SGLang raises a 400 abort: its HTTP front answers with `status_code`."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


async def _refuse(original: Callable, manager: Any, out: dict, state: Any, status: HTTPStatus, message: str) -> Any:
    await original(manager, out, state, True)  # SGLang's cleanup of the request's state; returns `out` for a stream
    raise RelayedRefusal(message, int(status))


def around_handle_abort_finish_reason(original: Callable, manager: Any, out: dict, state: Any, is_stream: bool,
                                      *args: Any, **kwargs: Any) -> Any:
    reason = (out.get("meta_info") or {}).get("finish_reason") if isinstance(out, dict) else None
    if isinstance(reason, dict) and reason.get("type") == "abort":
        refused = relayed_refusal(str(reason.get("message") or ""))
        if refused is not None:
            status, message = refused
            out["meta_info"]["finish_reason"] = {**reason, "status_code": status, "message": message}
            # raised on a stream too, as the refusals D makes itself before the first item: /generate answers
            # with an SSE error event of that code, an OpenAI stream with an HTTP 400 before any chunk
            return _refuse(original, manager, out, state, status, message)
    return original(manager, out, state, is_stream, *args, **kwargs)


def around_openai_error_response(original: Callable, serving: Any, message: str, err_type: str = "BadRequestError",
                                 status_code: int = 400, *args: Any, **kwargs: Any) -> Any:
    """SGLang's OpenAI handlers answer every ValueError from the tokenizer manager with a 400 and its text only
    (`create_error_response(str(e))`): a relayed failure of P's (FAILED_MESSAGE, a 503: P ran out of memory)
    keeps its 503 there too, so that a client retries it rather than take it for its own mistake."""
    if isinstance(message, str) and message.startswith(FAILED_MESSAGE_START):
        err_type, status_code = "ServiceUnavailableError", int(HTTPStatus.SERVICE_UNAVAILABLE)
    return original(serving, message, err_type, status_code, *args, **kwargs)


def install_relayed_refusal() -> None:
    """Applies the hooks in this (launcher) process. Idempotent."""
    register_missing(((HANDLE_ABORT, around_handle_abort_finish_reason, "AROUND"),
                      (OPENAI_ERROR_RESPONSE, around_openai_error_response, "AROUND")), apply=True)
