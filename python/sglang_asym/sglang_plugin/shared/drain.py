"""An asymmetric server that drains after SIGTERM admits nothing new.

SGLang's SIGTERM handler marks the server as exiting: /health answers 503 (so a router takes the worker
out of rotation after its failed checks) and the process exits once no request is left, but
/generate and the OpenAI routes still admit new requests meanwhile, so under steady load the drain
never ends. Hooked on the tokenizer manager of an asym-prefill / asym-decode server (its launcher
process, applied when that process publishes its server arguments): a request that arrives while the
server drains is refused with a 503 that says why (an SSE error event on a stream); running ones finish.

A SIGTERM that arrives while SGLang counts the server unhealthy (its scheduler did not answer a health
request within SGLANG_HEALTH_CHECK_TIMEOUT, 20 s, which a busy CPU scheduler computing a long prompt's
chunks can take) skips the drain: SGLang calls `force_exit_handler` (a no-op), stops its scheduler and
then its HTTP server, which waits for the in-flight requests' handlers, and those wait for a scheduler
that is gone. The server never exited and its clients hung (seen with a prompt P was shipping). Hooked
after `force_exit_handler`: every request still in flight is finished with an abort that says why (a
503 for a plain request, an abort finish on a stream), so the handlers return and the process exits.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..cpu_platform.cpu_patch import register_missing

log = logging.getLogger(__name__)

GENERATE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
FORCE_EXIT_HANDLER = "sglang.srt.managers.tokenizer_manager.TokenizerManager.force_exit_handler"
DRAINING_MESSAGE = ("sglang-asym: this server is shutting down (SIGTERM): it finishes its running requests "
                    "and admits no new one")
FORCE_EXIT_MESSAGE = ("sglang-asym: this server is shutting down (SIGTERM while its scheduler did not answer "
                      "health checks): the request was aborted")


class DrainingError(ValueError):
    """SGLang's HTTP front turns a ValueError into an error response with its `status_code`."""

    status_code = 503


def around_generate_request(original: Callable, manager: Any, *args: Any, **kwargs: Any) -> Any:
    if manager.gracefully_exit:
        log.warning("refused a request while draining")
        raise DrainingError(DRAINING_MESSAGE)
    return original(manager, *args, **kwargs)


def around_force_exit_handler(original: Callable, manager: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.managers.io_struct import AbortReq

    result = original(manager, *args, **kwargs)
    rids = list(manager.rid_to_state)
    if rids:
        log.error("force exit with %d request(s) in flight: each is answered with an abort", len(rids))
    reason = {"type": "abort", "message": FORCE_EXIT_MESSAGE, "status_code": DrainingError.status_code}
    for rid in rids:
        manager._handle_abort_req(AbortReq(rid=rid, finished_reason=reason, abort_message=FORCE_EXIT_MESSAGE))
    return result


def install_drain_refusal() -> None:
    register_missing(((GENERATE_REQUEST, around_generate_request, "AROUND"),
                      (FORCE_EXIT_HANDLER, around_force_exit_handler, "AROUND")), apply=True)
