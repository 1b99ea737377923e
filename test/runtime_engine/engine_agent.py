"""A disaggregated engine hosted in a spawned process (one Mooncake engine per process), driven by
blocking calls: `run(requests)` serves a batch of requests concurrently on the engine and returns
each request's events. Built from the same deterministic random weights as the in-process models."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from model.helpers import build
from sglang_asym.runtime.engine.options import EngineOptions
from sglang_asym.runtime.engine_api import BootstrapInfo, EngineError, GenerateRequest, SamplingParams
from sglang_asym.sched import SchedulerConfig

ENGINES = {
    "prefill": ("sglang_asym.runtime.engine.symmetric", "SymmetricPrefillEngine", "full"),
    "decode": ("sglang_asym.runtime.engine.symmetric", "SymmetricDecodeEngine", "full"),
    "asym-prefill": ("sglang_asym.runtime.engine.disaggregated", "AsymPrefillEngine", "prefill"),
    "asym-decode": ("sglang_asym.runtime.engine.disaggregated", "AsymDecodeEngine", "full"),
}


def engine_options(semantics: str, transfer_timeout_s: float = 30.0) -> EngineOptions:
    sched = SchedulerConfig(token_budget=140, max_window_rows_per_step=140, max_running=8, num_draft_tokens=0)
    return EngineOptions(model_path="tiny", semantics=semantics, max_total_tokens=1024, max_running=8,
                         prefill_chunk=64, scheduler=sched, transfer_timeout_s=transfer_timeout_s)


class EngineAgent:
    def __init__(self, mode: str, seed: int, semantics: str, transfer_timeout_s: float = 30.0) -> None:
        import importlib

        torch.set_num_threads(1)
        module, name, role = ENGINES[mode]
        model = build("tiny", seed=seed, role=role, cache_quant="release")
        self.engine = getattr(importlib.import_module(module), name)(model, engine_options(semantics, transfer_timeout_s))

    def info(self) -> dict[str, Any]:
        bootstrap = getattr(self.engine, "bootstrap", None)
        return {"bootstrap_port": bootstrap.port if bootstrap is not None else None}

    def run(self, requests: list[dict]) -> list[dict]:
        """Each request: rid, input_ids, sampling (SamplingParams kwargs), bootstrap (host, port, room)."""
        async def one(spec: dict) -> dict:
            req = GenerateRequest(spec["rid"], tuple(spec["input_ids"]), SamplingParams(**spec["sampling"]),
                                  bootstrap=BootstrapInfo(**spec["bootstrap"]))
            tokens, last = [], None
            try:
                async for event in self.engine.generate(req):
                    tokens += event.new_token_ids
                    last = event
            except EngineError as exc:
                return {"refused": f"{type(exc).__name__}: {exc}"}
            return {"tokens": tokens, "finish": last.finish_reason.to_json(), "error": last.error,
                    "meta": dict(last.meta)}

        async def all_of() -> list[dict]:
            return list(await asyncio.gather(*(one(spec) for spec in requests)))

        return asyncio.run(all_of())

    def state(self) -> dict[str, Any]:
        """What a test checks after the requests: nothing left running, every row given back."""
        loop = getattr(self.engine, "loop", None)
        if loop is not None:
            loop.cache_set.check_no_leak()
        caches = getattr(self.engine, "caches", None)
        if caches is not None:
            caches.check_no_leak()
        allocators = getattr(self.engine, "allocators", {})
        return {"active": loop.active_requests if loop is not None else 0,
                "free_source_slots": all(a.num_free == a.capacity for a in allocators.values())}

    def close(self) -> None:
        self.engine.shutdown()
