"""The boundary between the HTTP front and an engine (prefill worker, decode worker, colocated model).

The front parses and tokenizes requests, then hands the engine a `GenerateRequest` of token ids; the
engine answers with a stream of `TokenEvent`s. The contract an engine implements (`EngineClient`):

- `generate(req)` is an async generator (`async def generate(self, req): ... yield event`). It yields
  events until one with `finished=True`, then stops. A request the engine refuses is refused by raising
  an `EngineError` subclass before the first event (the front maps it to an HTTP status, see below).
  A failure after admission (transfer lost, worker died) is reported as a final event with `error` set.
- A prefill-role engine produces no tokens: once the request's prefix has been shipped to the decode
  worker it yields one final event `TokenEvent(rid, (), True, FinishReason.of_length(0))`, which the front
  turns into the well-formed empty response the router expects from P (SGLang's P answers the same way).
- A request whose `bootstrap.host == FAKE_BOOTSTRAP_HOST` is a health probe (SGLang's convention, sent by
  /health_generate with room 0 and one greedy token): serve it locally, without a transfer and without
  registering its room.
- A stop token that ends a request (EOS unless ignore_eos, or one of stop_token_ids) is the last of the
  final event's `new_token_ids`, with `FinishReason.stop(token_id)`; the front keeps it in `output_ids`
  and leaves it out of the text, as SGLang does. `max_new_tokens` reached: `FinishReason.of_length(n)`.
- `abort(rid)` is idempotent: an unknown or finished rid is a no-op. When the client goes away before the
  final event the front closes the `generate` iterator and then calls `abort(rid)`.
- `metrics` is the engine's `EngineMetrics`: the engine updates queue sizes, transfer bytes and latency,
  window steps and speculative acceptance; the front adds TTFT, ITL and request totals; `/metrics`
  renders it.

Typed errors and the HTTP status the front gives them: `RequestRejectedError` and its subclasses 400
(`BootstrapRoomInUseError` 409, which the routers retry with a fresh room), `EngineOverloadedError` 503,
any other `EngineError` 500.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, AsyncIterator, Mapping, Protocol, runtime_checkable

from sglang_asym.runtime.metrics import EngineMetrics
from sglang_asym.sampling import Sampling

MAX_NEW_TOKENS_LIMIT = 1 << 20  # a sanity bound; the real bound is the engine's max_context_length
BOOTSTRAP_ROOM_LIMIT = 1 << 63  # rooms are unsigned 63-bit (the router draws them below 2^63)
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's marker for health probes in PD mode
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings. `temperature == 0` or `top_k == 1` is greedy; `top_k == -1` is off."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens):
            raise ValueError(f"max_new_tokens must be an integer, got {self.max_new_tokens!r}")
        if not 0 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise ValueError(f"max_new_tokens must be in [0, {MAX_NEW_TOKENS_LIMIT}], got {self.max_new_tokens}")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or not (self.top_k == -1 or self.top_k >= 1):
            raise ValueError(f"top_k must be -1 (disabled) or a positive integer, got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not _INT64_MIN <= self.seed <= _INT64_MAX):
            raise ValueError(f"seed must be a 64-bit integer or null, got {self.seed!r}")
        if not isinstance(self.stop_token_ids, (tuple, list)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        stop_ids = tuple(self.stop_token_ids)
        for token_id in stop_ids:
            if not _is_int(token_id) or token_id < 0:
                raise ValueError(f"stop_token_ids must be non-negative integers, got {token_id!r}")
        object.__setattr__(self, "stop_token_ids", stop_ids)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a boolean, got {self.ignore_eos!r}")

    @property
    def token_sampling(self) -> Sampling:
        """The token filter's settings (`sglang_asym.sampling`), shared with speculative acceptance."""
        return Sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    @property
    def is_greedy(self) -> bool:
        return self.token_sampling.greedy


@dataclass(frozen=True)
class BootstrapInfo:
    """Where the decode worker meets the prefill worker: P's bootstrap server and the request's room."""

    host: str
    port: int | None
    room: int

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"bootstrap_host must be a non-empty string, got {self.host!r}")
        if self.port is not None and (not _is_int(self.port) or not 0 <= self.port <= 65535):
            raise ValueError(f"bootstrap_port must be an integer in [0, 65535] or null, got {self.port!r}")
        if not _is_int(self.room) or not 0 <= self.room < BOOTSTRAP_ROOM_LIMIT:
            raise ValueError(f"bootstrap_room must be an integer in [0, 2^63), got {self.room!r}")

    @property
    def is_health_probe(self) -> bool:
        return self.host == FAKE_BOOTSTRAP_HOST


@dataclass(frozen=True)
class GenerateRequest:
    """One tokenized request as the engine sees it."""

    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams
    stream: bool = False
    bootstrap: BootstrapInfo | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rid, str) or not self.rid:
            raise ValueError(f"rid must be a non-empty string, got {self.rid!r}")
        ids = tuple(self.input_ids)
        if not ids:
            raise ValueError(f"request {self.rid}: input_ids is empty")
        if not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError(f"request {self.rid}: input_ids must be non-negative integers")
        object.__setattr__(self, "input_ids", ids)


class FinishKind(str, Enum):
    STOP = "stop"  # a stop token (EOS or one of stop_token_ids) was generated
    LENGTH = "length"  # max_new_tokens reached (or a prefill-role request whose transfer is done)
    ABORT = "abort"  # aborted by the client, the server, or an error


@dataclass(frozen=True)
class FinishReason:
    kind: FinishKind
    matched: int | str | None = None  # STOP: the token id that stopped it
    length: int | None = None  # LENGTH: the number of tokens generated
    message: str | None = None  # ABORT: why

    @classmethod
    def stop(cls, matched: int | str) -> FinishReason:
        return cls(FinishKind.STOP, matched=matched)

    @classmethod
    def of_length(cls, length: int) -> FinishReason:
        return cls(FinishKind.LENGTH, length=length)

    @classmethod
    def abort(cls, message: str = "Aborted") -> FinishReason:
        return cls(FinishKind.ABORT, message=message)

    def to_json(self) -> dict[str, Any]:
        """SGLang's `meta_info.finish_reason` shape."""
        if self.kind is FinishKind.STOP:
            return {"type": "stop", "matched": self.matched}
        if self.kind is FinishKind.LENGTH:
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message or "Aborted"}


@dataclass(frozen=True)
class TokenEvent:
    """New tokens of one request. `meta` carries per-request facts for `meta_info` (e.g. cached_tokens)."""

    rid: str
    new_token_ids: tuple[int, ...] = ()
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "new_token_ids", tuple(self.new_token_ids))
        if self.finished != (self.finish_reason is not None):
            raise ValueError(f"request {self.rid}: a finish_reason must come with finished=True and only then")
        if self.error is not None and not self.finished:
            raise ValueError(f"request {self.rid}: an event with an error must be the final one")


class EngineRole(str, Enum):
    """SGLang's disaggregation modes; the asymmetric variants are the engine's business."""

    COLOCATED = "null"
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def requires_bootstrap(self) -> bool:
        return self is not EngineRole.COLOCATED


class EngineError(Exception):
    """A request the engine could not serve (HTTP 500 unless a subclass says otherwise)."""


class RequestRejectedError(EngineError):
    """The request is invalid for this engine (HTTP 400)."""


class PromptTooLongError(RequestRejectedError):
    """The prompt (plus max_new_tokens) does not fit the engine's context."""


class BootstrapRequiredError(RequestRejectedError):
    """A disaggregated engine got a request without bootstrap fields."""


class BootstrapRoomInUseError(RequestRejectedError):
    """The bootstrap room is already taken by another request (HTTP 409)."""


class EngineOverloadedError(EngineError):
    """The engine cannot take more requests now (HTTP 503)."""


@runtime_checkable
class EngineClient(Protocol):
    """What the HTTP front needs from an engine. See the module docstring for the contract."""

    @property
    def role(self) -> EngineRole: ...

    @property
    def max_context_length(self) -> int:
        """Most tokens (prompt + max_new_tokens) one request may take; the front rejects longer ones."""
        ...

    @property
    def metrics(self) -> EngineMetrics: ...

    def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        """An async generator: `async def generate(self, req): ... yield TokenEvent(...)`."""
        ...

    async def abort(self, rid: str) -> None: ...

    def model_info(self) -> dict[str, Any]:
        """Merged into /model_info: model_type, architectures, eos_token_ids, ..."""
        ...

    def server_info(self) -> dict[str, Any]:
        """Merged into /server_info: disaggregation_bootstrap_port, max_running_requests, page_size, ..."""
        ...

    def health(self) -> bool: ...
