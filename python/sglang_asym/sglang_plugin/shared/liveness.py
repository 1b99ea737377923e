"""/health on an asym server answers liveness, not a generation.

SGLang's /health runs a one-token request through the scheduler and waits up to
SGLANG_HEALTH_CHECK_TIMEOUT for any output. A busy scheduler computing a long prompt's chunks (on CPU,
tens of seconds) answers later than a router's health timeout, so the router evicts a busy, working
worker and answers 503 until the load is gone and its checks pass again. With SGLang's own switch
SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION off, /health answers 200 from the HTTP front at once while
the server is up (503 while it starts or drains after SIGTERM). A scheduler that dies takes its server
down (SGLang's scheduler signals its launcher, which exits), so a 200 still means the process tree
lives. /health_generate stays the deep check that runs a generation.
"""

from __future__ import annotations

import os

HEALTH_GENERATION_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"


def liveness_health_default() -> None:
    """Set in the launcher of an asym server; an operator's own value is kept."""
    os.environ.setdefault(HEALTH_GENERATION_ENV, "false")
