"""RequestRunner: admission checks, then one request's engine events turned into detokenized progress.

Shared by the native and OpenAI routes. `run()` yields the same `RequestState` after every engine event
(read it before pulling the next one). If the consumer stops early (client gone: aiohttp cancels the
handler, or the route closes the iterator) the runner calls `engine.abort(rid)`.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, AsyncIterator, Sequence

from sglang_asym.runtime.engine_api import (
    BootstrapInfo,
    EngineClient,
    EngineError,
    FinishKind,
    FinishReason,
    GenerateRequest,
    TokenEvent,
)
from sglang_asym.runtime.http.errors import ApiError
from sglang_asym.runtime.http.sampling import ParsedSampling
from sglang_asym.runtime.http.tokenizer import IncrementalDetokenizer, TextTokenizer


logger = logging.getLogger(__name__)


def new_rid() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class AdmittedRequest:
    """A request that passed the front's checks, with the detokenizer options the engine never sees."""

    engine_request: GenerateRequest
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    log_metrics: bool = True  # off for health probes


@dataclass
class RequestState:
    """Progress of one request: totals so far plus what the latest engine event added."""

    rid: str
    prompt_tokens: int
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    delta_text: str = ""
    delta_ids: tuple[int, ...] = ()
    finish: FinishReason | None = None
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    e2e_latency: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def meta_info(self) -> dict[str, Any]:
        """SGLang's `meta_info`; the engine's own per-request facts are merged in last."""
        info: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish.to_json() if self.finish else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": 0,
        }
        if self.e2e_latency is not None:
            info["e2e_latency"] = self.e2e_latency
        info.update(self.meta)
        return info


class RequestRunner:
    def __init__(self, engine: EngineClient, tokenizer: TextTokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self._live_rids: set[str] = set()

    def live_rids(self) -> tuple[str, ...]:
        return tuple(self._live_rids)

    def admit(self, rid: str, input_ids: Sequence[int], sampling: ParsedSampling, stream: bool,
              bootstrap: BootstrapInfo | None) -> AdmittedRequest:
        num_input, limit = len(input_ids), self.engine.max_context_length
        if num_input == 0:
            raise ApiError.bad_request("the prompt is empty")
        if num_input >= limit:
            raise ApiError.bad_request(
                f"The input ({num_input} tokens) is longer than the model's context length ({limit} tokens).")
        params = sampling.resolve(num_input, limit)
        if num_input + params.max_new_tokens > limit:
            raise ApiError.bad_request(
                f"Requested token count exceeds the model's maximum context length of {limit} tokens. You "
                f"requested a total of {num_input + params.max_new_tokens} tokens: {num_input} tokens from the "
                f"input and {params.max_new_tokens} tokens for the completion.")
        role = self.engine.role
        if not role.requires_bootstrap:
            bootstrap = None  # a colocated engine has no partner; the fields mean nothing to it
        elif bootstrap is None:
            raise ApiError.bad_request(
                f"this server runs the {role.value} role of a disaggregated pair: bootstrap_host and "
                "bootstrap_room are required (send requests through the PD router)", param="bootstrap_room")
        try:
            request = GenerateRequest(rid, tuple(input_ids), params, stream, bootstrap)
        except ValueError as exc:
            raise ApiError.bad_request(str(exc)) from exc
        return AdmittedRequest(request, sampling.skip_special_tokens, sampling.no_stop_trim)

    async def run(self, admitted: AdmittedRequest) -> AsyncIterator[RequestState]:
        req = admitted.engine_request
        if req.rid in self._live_rids:
            raise ApiError.bad_request(f"Duplicate request ID {req.rid!r}: a request with this rid is running")
        self._live_rids.add(req.rid)
        state = RequestState(req.rid, len(req.input_ids))
        detok = IncrementalDetokenizer(self.tokenizer, admitted.skip_special_tokens)
        refused = False  # the engine raised: it has already dropped the request
        last_token_time: float | None = None
        try:
            async with aclosing(self.engine.generate(req)) as events:
                try:
                    async for event in events:
                        if admitted.log_metrics:
                            last_token_time = self._observe_timing(state, event, req.stream, last_token_time)
                        self._apply(state, detok, event, admitted.no_stop_trim)
                        yield state
                        if state.finished:
                            break
                except EngineError as exc:
                    refused = True
                    raise ApiError.from_engine_error(exc) from exc
                except Exception as exc:  # an engine bug: answer 500 (or an error chunk), keep serving
                    logger.exception("engine failed on request %s", req.rid)
                    raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {exc!r}") from exc
            if not state.finished:
                raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR,
                               f"engine stream of request {req.rid!r} ended before its final event")
        finally:
            if not state.finished and not refused:
                await self.engine.abort(req.rid)
            self._live_rids.discard(req.rid)

    def _observe_timing(self, state: RequestState, event: TokenEvent, streaming: bool,
                        last_token_time: float | None) -> float | None:
        now = time.monotonic()
        metrics = self.engine.metrics
        num_new = len(event.new_token_ids)
        if num_new:
            if last_token_time is None:
                metrics.observe_ttft(now - state.started, streaming)
            else:
                metrics.observe_inter_token((now - last_token_time) / num_new, num_new)
            last_token_time = now
        if event.finished:
            metrics.observe_request_done(now - state.started, state.prompt_tokens,
                                         len(state.output_ids) + num_new, event.finish_reason.kind.value)
        return last_token_time

    @staticmethod
    def _apply(state: RequestState, detok: IncrementalDetokenizer, event: TokenEvent, no_stop_trim: bool) -> None:
        new_ids = event.new_token_ids
        state.output_ids.extend(new_ids)
        text_ids = new_ids
        finish = event.finish_reason
        if (finish is not None and finish.kind is FinishKind.STOP and isinstance(finish.matched, int)
                and not no_stop_trim and new_ids and new_ids[-1] == finish.matched):
            text_ids = new_ids[:-1]  # the stop token stays in output_ids but not in the text (SGLang)
        delta = detok.add(text_ids)
        if event.finished:
            delta += detok.finish()
            state.finish, state.error = finish, event.error
            state.e2e_latency = time.monotonic() - state.started
        state.delta_ids, state.delta_text, state.text = new_ids, delta, detok.text
        state.meta.update(event.meta)
