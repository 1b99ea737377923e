"""Executors of static-shape segments: eager calls (CPU, or an eager fallback), CUDA graphs, or an
emulation of CUDA-graph buffer semantics that runs anywhere (CPU checks of the graph path).

Both take `call(key, fn, inputs)` and return fn's outputs for those inputs; `key` names the segment
and its row count. The graph executor captures each key once (warm-up on a side stream, capture
into one shared memory pool, then replay), keeps its static inputs and outputs, and on later calls
copies only inputs that are not already its static tensors: chained segments pass one segment's
static outputs straight in as the next one's inputs, so a chain of segments copies nothing but the
eager attention output between them.

Sharing one pool is safe because of how the runner uses outputs: a segment's outputs are read only
before the next segment replays (by the eager attention and by that next segment), and the final
logits are copied out at once. A later capture may therefore reuse an earlier graph's temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch

from .capture_guard import no_host_sync

Tensors = tuple[torch.Tensor, ...]


@dataclass
class SegmentCounters:
    """What the executors ran; owned by one runner and read by its stats."""

    eager_calls: int = 0
    graph_captures: int = 0
    graph_replays: int = 0


class EagerExecutor:
    """Calls the segment function directly (same functions and padding as the graph executor)."""

    def __init__(self, counters: SegmentCounters) -> None:
        self.counters = counters

    def call(self, key: Hashable, fn: Callable[..., Tensors], inputs: Tensors) -> Tensors:
        self.counters.eager_calls += 1
        return fn(*inputs)


@dataclass
class _Captured:
    replay: Callable[[], None]
    inputs: Tensors
    outputs: Tensors
    input_ids: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.input_ids = tuple(id(t) for t in self.inputs)


class _StaticExecutor:
    """Captured segments with static input and output tensors; `_record` makes the replay."""

    def __init__(self, counters: SegmentCounters) -> None:
        self.counters = counters
        self._captured: dict[Hashable, _Captured] = {}
        self._static_outputs: set[int] = set()  # ids of tensors some capture writes (kept alive by _captured)

    @property
    def captured_keys(self) -> tuple[Hashable, ...]:
        return tuple(self._captured)

    def call(self, key: Hashable, fn: Callable[..., Tensors], inputs: Tensors) -> Tensors:
        entry = self._captured.get(key)
        if entry is None:
            # Another capture's outputs are already static: the chain reads them in place.
            static_inputs = tuple(t if id(t) in self._static_outputs else t.clone() for t in inputs)
            replay, outputs = self._record(fn, static_inputs)
            entry = self._captured[key] = _Captured(replay, static_inputs, tuple(outputs))
            self._static_outputs.update(id(t) for t in entry.outputs)
            self.counters.graph_captures += 1
        for static, given, given_id in zip(entry.inputs, inputs, entry.input_ids):
            if id(given) != given_id:
                if given.shape != static.shape or given.dtype != static.dtype:
                    raise ValueError(f"segment {key!r}: input {tuple(given.shape)} {given.dtype} does not match the "
                                     f"captured {tuple(static.shape)} {static.dtype}")
                static.copy_(given)
        entry.replay()
        self.counters.graph_replays += 1
        return entry.outputs

    def _record(self, fn: Callable[..., Tensors], static_inputs: Tensors) -> tuple[Callable[[], None], Tensors]:
        raise NotImplementedError


class CudaGraphExecutor(_StaticExecutor):
    """One CUDA graph per segment key, captured on first use."""

    def __init__(self, counters: SegmentCounters, device: torch.device, warmup_calls: int = 2) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a CUDA GPU, and torch.cuda.is_available() is False")
        super().__init__(counters)
        self.device, self.warmup_calls = device, warmup_calls
        self._pool = torch.cuda.graph_pool_handle()

    def _record(self, fn: Callable[..., Tensors], static_inputs: Tensors) -> tuple[Callable[[], None], Tensors]:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # lazy initialisation (cuBLAS workspaces) happens outside the capture
            for _ in range(self.warmup_calls):
                fn(*static_inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = tuple(fn(*static_inputs))
        return graph.replay, outputs


class EmulatedGraphExecutor(_StaticExecutor):
    """CUDA-graph semantics on any device, for checking the runner's buffer discipline on CPU: the
    same static inputs and chaining, and outputs that are fixed tensors overwritten by every replay
    (a caller that keeps an output past the next replay of its segment reads the newer values).
    Every call runs under `capture_guard.no_host_sync()`: a host sync fails as capture would."""

    def _record(self, fn: Callable[..., Tensors], static_inputs: Tensors) -> tuple[Callable[[], None], Tensors]:
        with no_host_sync():  # what a CUDA graph could not capture fails here too
            outputs = tuple(t.clone() for t in fn(*static_inputs))

        def replay() -> None:
            with no_host_sync():
                for out, new in zip(outputs, fn(*static_inputs)):
                    out.copy_(new)

        return replay, outputs
