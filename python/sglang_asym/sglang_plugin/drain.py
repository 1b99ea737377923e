"""An asymmetric server that drains after SIGTERM admits nothing new.

SGLang's SIGTERM handler marks the server as exiting: /health answers 503 (so a router takes the worker
out of rotation after its failed checks) and the process exits once no request is left, but
/generate and the OpenAI routes still admit new requests meanwhile, so under steady load the drain
never ends. Hooked on the tokenizer manager of an asym-prefill / asym-decode server (its launcher
process, applied when that process publishes its server arguments): a request that arrives while the
server drains is refused with a 503 that says why (an SSE error event on a stream); running ones finish.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger(__name__)

GENERATE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
DRAINING_MESSAGE = ("sglang-asym: this server is shutting down (SIGTERM): it finishes its running requests "
                    "and admits no new one")


class DrainingError(ValueError):
    """SGLang's HTTP front turns a ValueError into an error response with its `status_code`."""

    status_code = 503


def around_generate_request(original: Callable, manager: Any, *args: Any, **kwargs: Any) -> Any:
    if manager.gracefully_exit:
        log.warning("refused a request while draining")
        raise DrainingError(DRAINING_MESSAGE)
    return original(manager, *args, **kwargs)


def install_drain_refusal() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if GENERATE_REQUEST not in HookRegistry._patched:
        HookRegistry.register(GENERATE_REQUEST, around_generate_request, HookType.AROUND)
        HookRegistry.apply_hooks()
