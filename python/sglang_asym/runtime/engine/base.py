"""What the embedded engines share: the EngineClient surface, request admission checks, and the
bridge from the model threads' events to each request's asyncio stream."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

import torch
from prometheus_client import Histogram

from ...cache import CacheSet
from ...config import V41Config
from ...split import SplitPlan
from ..engine_api import (BootstrapRequiredError, EngineRole, GenerateRequest, PromptTooLongError,
                          RequestRejectedError, TokenEvent)
from ..metrics import EngineMetrics
from ..pool_accounting import PoolSnapshot, TransferUsage, snapshot
from .options import EngineOptions

logger = logging.getLogger(__name__)
_COMPUTE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


class EventStream:
    """Events for one request, put from any thread, awaited on the engine's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self._queue = loop, asyncio.Queue()

    def emit(self, event: TokenEvent) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the request's event loop is gone (client and server shut down): drop it
            logger.debug("dropping event for %s: its event loop is closed", event.rid)

    async def events(self) -> AsyncIterator[TokenEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if event.finished:
                return


class EngineBase:
    role: EngineRole

    def __init__(self, cfg: V41Config, options: EngineOptions, mode_name: str) -> None:
        self.cfg, self.options, self.mode_name = cfg, options, mode_name
        self._metrics = EngineMetrics(options.model_path, self.role.value)
        # The prefill side's compute per request (forwards + first-token draw), in this engine's registry.
        self._prefill_compute = Histogram(
            "sglang_asym:prefill_compute_seconds", "Prompt compute per request on the prefill side (P, or a "
            "colocated server's prefix).", ("model_name", "role"), buckets=_COMPUTE_BUCKETS,
            registry=self._metrics.registry).labels(model_name=options.model_path, role=self.role.value)
        self._healthy = True
        self._metrics.attach_pool_probe(self.pool_snapshot)

    # ---- EngineClient surface -------------------------------------------------------------
    @property
    def max_context_length(self) -> int:
        return min(self.options.max_total_tokens, self.cfg.max_position_embeddings)

    @property
    def metrics(self) -> EngineMetrics:
        return self._metrics

    def health(self) -> bool:
        return self._healthy

    def observe_prefill_compute(self, seconds: float) -> None:
        self._prefill_compute.observe(seconds)

    # ---- pool accounting (runtime/pool_accounting.py) ------------------------------------------
    def cache_sets(self) -> dict[str, CacheSet]:
        """The engine's cache sets by name; "requests" holds the served requests."""
        raise NotImplementedError

    def transfer_usage(self) -> TransferUsage | None:
        return None

    def pool_snapshot(self) -> PoolSnapshot:
        return snapshot(self.cache_sets(), self.transfer_usage())

    def model_info(self) -> dict[str, Any]:
        return {"model_type": "deepseek_v41", "architectures": ["DeepseekV41ForCausalLM"],
                "eos_token_ids": [self.cfg.eos_token_id], "is_generation": True}

    def server_info(self) -> dict[str, Any]:
        return {"disaggregation_mode": self.mode_name, "asym_window": self.options.window,
                "asym_semantics": self.options.semantics.value, "cache_quant": self.options.cache_quant,
                "disaggregation_bootstrap_port": self.options.bootstrap_port,
                "max_running_requests": self.options.max_running, "page_size": self.options.page_rows,
                "max_total_num_tokens": self.options.max_total_tokens, "device": "cpu",
                "internal_states": [self.pool_snapshot().to_json()]}

    # ---- admission ---------------------------------------------------------------------------
    def split_for(self, req: GenerateRequest) -> SplitPlan:
        n = len(req.input_ids)
        if n + req.sampling.max_new_tokens > self.max_context_length:
            raise PromptTooLongError(f"prompt of {n} tokens + max_new_tokens {req.sampling.max_new_tokens} exceeds "
                                     f"the context limit {self.max_context_length}")
        bad = next((t for t in req.input_ids if t >= self.cfg.vocab_size), None)
        if bad is not None:
            raise RequestRejectedError(f"token id {bad} is outside the vocabulary [0, {self.cfg.vocab_size})")
        return SplitPlan(self.cfg, n, self.options.window, self.options.semantics)

    def require_bootstrap(self, req: GenerateRequest) -> None:
        if req.bootstrap is None:
            raise BootstrapRequiredError(f"a {self.mode_name} server needs bootstrap_host, bootstrap_port and "
                                         "bootstrap_room (send requests through the router)")

    @staticmethod
    def prompt_tensor(req: GenerateRequest) -> torch.Tensor:
        return torch.tensor(req.input_ids, dtype=torch.long)
