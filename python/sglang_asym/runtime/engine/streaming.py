"""Hand a request to the decode loop and stream its events back (every engine with a decode loop
does this); join a request whose full prompt already ran (symmetric PD's decode worker, a colocated
exact prefill) as a running one, under a gate that bounds how many join at once."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from functools import partial
from typing import Any, AsyncIterator, Callable, Mapping

import torch

from ...model import V41Model
from ...split import SplitPlan
from ..engine_api import GenerateRequest, TokenEvent
from .base import EventStream
from .decode_loop import ActiveRequest, DecodeLoop, EmitFn
from .request_state import install_state

POLL_S = 0.002


async def stream_from_loop(loop: DecodeLoop, rid: str, submit: Callable[[EmitFn], None],
                           final_meta: Mapping[str, Any] | None = None) -> AsyncIterator[TokenEvent]:
    """`submit(emit)` puts the request into the loop; its events are yielded until the final one
    (which gets `final_meta` merged into its meta). A consumer that stops early (the client went
    away) aborts the request in the loop."""
    stream = EventStream(asyncio.get_running_loop())
    submit(stream.emit)
    finished = False
    try:
        async for event in stream.events():
            finished = event.finished
            if finished and final_meta:
                event = dataclasses.replace(event, meta={**event.meta, **final_meta})
            yield event
    finally:
        if not finished:
            loop.abort(rid, "client went away")


class JoinGate:
    """At most `limit` requests joined running at once (a joined request takes a decode slot at once;
    the scheduler refuses more than max_running). Thread-based so it works from any event loop."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"join limit must be >= 1, got {limit}")
        self.limit, self._held, self._lock = limit, 0, threading.Lock()

    @property
    def held(self) -> int:
        return self._held

    def try_acquire(self) -> bool:
        with self._lock:
            if self._held >= self.limit:
                return False
            self._held += 1
            return True

    def release(self) -> None:
        with self._lock:
            if self._held == 0:
                raise RuntimeError("JoinGate released more often than acquired")
            self._held -= 1

    async def __aenter__(self) -> "JoinGate":
        while not self.try_acquire():
            await asyncio.sleep(POLL_S)
        return self

    async def __aexit__(self, *exc) -> None:
        self.release()


async def join_running(loop: DecodeLoop, gate: JoinGate, model: V41Model, req: GenerateRequest,
                       prompt: torch.Tensor, split: SplitPlan, rows: dict[str, torch.Tensor], first_token: int,
                       generator: torch.Generator | None, final_meta: Mapping[str, Any] | None = None
                       ) -> AsyncIterator[TokenEvent]:
    """A request whose full prompt already ran joins the decode loop running; its events stream back."""
    # Greedy requests never draw, but every request in the loop carries a generator.
    generator = generator if generator is not None else torch.Generator()
    install = partial(install_state, model, rows=rows, prompt_len=split.prompt_len)

    def submit(emit) -> None:
        loop.submit_running(ActiveRequest(req.rid, prompt, split, None, req.sampling, emit, generator=generator),
                            first_token, install)

    async with gate:
        async for event in stream_from_loop(loop, req.rid, submit, final_meta=final_meta):
            yield event
