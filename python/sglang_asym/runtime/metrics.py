"""EngineMetrics: the Prometheus counters and histograms one engine and its HTTP front update.

Each instance owns its own registry, so several engines in one process (tests, a colocated P and D)
do not collide. Names follow SGLang's (`sglang:...`) where SGLang has the same quantity, so existing
dashboards read them; quantities specific to the asymmetric split are `sglang_asym:...`.
Every series carries the labels `model_name` and `role` (null / prefill / decode). An engine attaches
a pool probe (`attach_pool_probe`): its pool usage is read at every render (runtime/pool_metrics.py).
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..sched import GraphKind
from .pool_accounting import PoolSnapshot
from .pool_metrics import PoolGauges

_LABELS = ("model_name", "role")
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
_BYTES_BUCKETS = tuple(float(1 << s) for s in range(10, 32, 2))  # 1 KiB .. 1 GiB
_ACCEPT_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
GRAPH_KINDS = tuple(kind.value for kind in GraphKind)


class QueueName(str, Enum):
    """Scheduler queues an engine reports; values are SGLang's gauge names."""

    RUNNING = "sglang:num_running_reqs"
    WAITING = "sglang:num_queue_reqs"
    PREFILL_BOOTSTRAP = "sglang:num_prefill_bootstrap_queue_reqs"
    PREFILL_INFLIGHT = "sglang:num_prefill_inflight_queue_reqs"
    DECODE_PREALLOC = "sglang:num_decode_prealloc_queue_reqs"
    DECODE_TRANSFER = "sglang:num_decode_transfer_queue_reqs"


class EngineMetrics:
    """Counters/histograms for one engine; `render()` gives the Prometheus text exposition."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, role: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name, "role": role}
        reg = self.registry

        def bind(metric):
            return metric.labels(**labels)

        self._queues = {
            q: bind(Gauge(q.value, f"Requests in the {q.name.lower()} queue.", _LABELS, registry=reg))
            for q in QueueName
        }
        self._ttft = self._ttft_children(reg, labels)
        self._itl = bind(Histogram("sglang:inter_token_latency_seconds", "Inter-token latency.", _LABELS,
                                   buckets=_LATENCY_BUCKETS, registry=reg))
        self._e2e = bind(Histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency.", _LABELS,
                                   buckets=_E2E_BUCKETS, registry=reg))
        self._prompt_tokens = bind(Counter("sglang:prompt_tokens", "Prompt tokens processed.", _LABELS, registry=reg))
        self._generation_tokens = bind(Counter("sglang:generation_tokens", "Tokens generated.", _LABELS, registry=reg))
        self._requests = Counter("sglang:num_requests", "Finished requests by finish reason.",
                                 (*_LABELS, "finish_reason"), registry=reg)
        self._labels = labels
        self._transfer_seconds = bind(Histogram("sglang_asym:kv_transfer_seconds", "Prefix transfer latency (P -> D).",
                                                _LABELS, buckets=_LATENCY_BUCKETS, registry=reg))
        self._transfer_bytes = bind(Histogram("sglang_asym:kv_transfer_bytes", "Prefix payload bytes per request.",
                                              _LABELS, buckets=_BYTES_BUCKETS, registry=reg))
        self._transfer_failures = bind(Counter("sglang:num_transfer_failed_reqs", "Requests whose transfer failed.",
                                               _LABELS, registry=reg))
        self._transfer_fallbacks = bind(Counter("sglang_asym:transfer_fallback_recompute",
                                                "Requests whose failed prefix transfer the decode worker "
                                                "recomputed itself (--transfer-fallback recompute).", _LABELS,
                                                registry=reg))
        self._window_seconds = bind(Histogram("sglang_asym:window_step_seconds", "Decode-side window step latency.",
                                              _LABELS, buckets=_LATENCY_BUCKETS, registry=reg))
        self._window_tokens = bind(Counter("sglang_asym:window_step_tokens", "Tokens run in window steps.", _LABELS,
                                           registry=reg))
        self._spec_draft = bind(Counter("sglang_asym:spec_draft_tokens", "Draft tokens proposed.", _LABELS,
                                        registry=reg))
        self._spec_accepted = bind(Counter("sglang_asym:spec_accepted_tokens", "Draft tokens accepted.", _LABELS,
                                           registry=reg))
        self._forwards = Counter("sglang_asym:decode_forwards", "Decode-worker forwards by the graph shape chosen "
                                 "(full, row_bucket, breakable, eager).", (*_LABELS, "graph_kind"), registry=reg)
        self._spec_accept_length = bind(Histogram("sglang:spec_accept_length",
                                                  "Tokens emitted per verify step (accepted drafts + 1).", _LABELS,
                                                  buckets=_ACCEPT_BUCKETS, registry=reg))
        self._pool_probe: Callable[[], PoolSnapshot] | None = None
        self._pool_gauges: PoolGauges | None = None

    def attach_pool_probe(self, probe: Callable[[], PoolSnapshot]) -> None:
        """`probe()` is read at every render() and sets the pool gauges (runtime/pool_metrics.py)."""
        if self._pool_probe is not None:
            raise RuntimeError("a pool probe is already attached to these metrics")
        self._pool_gauges = PoolGauges(self.registry, self._labels)
        self._pool_probe = probe

    @staticmethod
    def _ttft_children(reg: CollectorRegistry, labels: dict[str, str]) -> dict[bool, Histogram]:
        ttft = Histogram("sglang:time_to_first_token_seconds", "Time to first token.", (*_LABELS, "is_streaming"),
                         buckets=_TTFT_BUCKETS, registry=reg)
        return {s: ttft.labels(**labels, is_streaming=str(s).lower()) for s in (False, True)}

    # --- updated by the engine -------------------------------------------------------------------
    def set_queue_size(self, queue: QueueName, num_requests: int) -> None:
        if num_requests < 0:
            raise ValueError(f"queue size of {queue.name} must be >= 0, got {num_requests}")
        self._queues[queue].set(num_requests)

    def observe_transfer(self, nbytes: int, seconds: float) -> None:
        if nbytes < 0 or seconds < 0:
            raise ValueError(f"transfer bytes and seconds must be >= 0, got {nbytes}, {seconds}")
        self._transfer_bytes.observe(nbytes)
        self._transfer_seconds.observe(seconds)

    def count_transfer_failure(self) -> None:
        self._transfer_failures.inc()

    def count_transfer_fallback(self) -> None:
        self._transfer_fallbacks.inc()

    def observe_window_step(self, seconds: float, num_tokens: int) -> None:
        self._window_seconds.observe(seconds)
        self._window_tokens.inc(num_tokens)

    def count_forwards(self, graph_kinds: Sequence[str]) -> None:
        """One step's batched forwards, each under the graph kind `sched.graphs` chose for it."""
        for kind in graph_kinds:
            if kind not in GRAPH_KINDS:
                raise ValueError(f"graph kind must be one of {GRAPH_KINDS}, got {kind!r}")
            self._forwards.labels(**self._labels, graph_kind=kind).inc()

    def observe_spec_verify(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        if not 0 <= num_accepted_tokens <= num_draft_tokens:
            raise ValueError(f"accepted drafts must be in [0, {num_draft_tokens}], got {num_accepted_tokens}")
        self._spec_draft.inc(num_draft_tokens)
        self._spec_accepted.inc(num_accepted_tokens)
        self._spec_accept_length.observe(num_accepted_tokens + 1)

    # --- updated by the HTTP front ---------------------------------------------------------------
    def observe_ttft(self, seconds: float, streaming: bool) -> None:
        self._ttft[streaming].observe(seconds)

    def observe_inter_token(self, seconds_per_token: float, num_tokens: int) -> None:
        for _ in range(num_tokens):
            self._itl.observe(seconds_per_token)

    def observe_request_done(self, e2e_seconds: float, prompt_tokens: int, completion_tokens: int,
                             finish_reason: str) -> None:
        self._e2e.observe(e2e_seconds)
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc(completion_tokens)
        self._requests.labels(**self._labels, finish_reason=finish_reason).inc()

    def render(self) -> bytes:
        if self._pool_probe is not None:
            self._pool_gauges.update(self._pool_probe())
        return generate_latest(self.registry)
