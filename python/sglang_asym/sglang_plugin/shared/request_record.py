"""One frozen record per request, owned by the plugin: what the asymmetric roles note on SGLang's `Req`.

SGLang's Req has no room for extensions, so the plugin keeps one attribute on it (REQUEST_ATTR) holding an
`AsymRequest`; each change replaces the whole record (`note`), so a shallow copy of a Req (the recompute
fallback's, decode/transfer_fallback.py) keeps the record as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

REQUEST_ATTR = "_sglang_asym"


@dataclass(frozen=True)
class AsymRequest:
    prompt_len: int | None = None  # the sequence whose split applies: P's cut prompt N, D's rebootstrapped one
    zero_compute: bool = False  # P: N <= W, concluded without a forward (prefill/zero.py)
    window: Any = None  # D: decode/window_step.py's WindowProgress while rows of its window are to run
    fallback: Any = None  # D: decode/transfer_fallback.py's Fallback once its prefix is recomputed here
    client_aborted: bool = False  # D: aborted by its client while queued (never recomputed)


NO_RECORD = AsymRequest()


def request_record(req: Any) -> AsymRequest:
    return getattr(req, REQUEST_ATTR, None) or NO_RECORD


def note(req: Any, **changes: Any) -> AsymRequest:
    """Replaces the request's record with one that has `changes`."""
    record = replace(request_record(req), **changes)
    setattr(req, REQUEST_ATTR, record)
    return record
