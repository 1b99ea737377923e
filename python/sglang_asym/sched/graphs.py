"""CUDA-graph shape choice for each forward of a planned step (pure; the GPU runner replays it, CPU logs it).

  decode-only forward -> FULL graph captured at (batch-size bucket, 1 + k); every request occupies the
                         verify width, so a shorter q_len and the padded batch slots are padding rows;
  window-only forward -> ROW_BUCKET graph: rows padded up to a multiple of the row bucket (128);
  mixed forward       -> BREAKABLE graph (segments captured at row buckets, eager attention) or EAGER.
A forward larger than every captured shape runs EAGER with no padding.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from .config import GraphConfig, MixedBackend, SchedulerConfig, StepMode
from .plan import StepPlan


class GraphKind(str, Enum):
    FULL = "full"
    ROW_BUCKET = "row_bucket"
    BREAKABLE = "breakable"
    EAGER = "eager"


class ForwardKind(str, Enum):
    DECODE = "decode"
    WINDOW = "window"
    MIXED = "mixed"


@dataclass(frozen=True)
class GraphChoice:
    """How one forward runs: graph kind and the padded shape it is replayed at."""

    forward: ForwardKind
    kind: GraphKind
    num_requests: int
    actual_rows: int
    padded_shape: tuple[int, ...]  # FULL: (batch bucket, verify width); otherwise (rows,)

    def __post_init__(self) -> None:
        if self.actual_rows < 1 or self.num_requests < 1:
            raise ValueError(f"a forward needs rows and requests, got {self.actual_rows} rows, {self.num_requests} requests")
        if self.padded_rows < self.actual_rows:
            raise ValueError(f"padded shape {self.padded_shape} holds fewer rows than the {self.actual_rows} actual rows")
        if self.kind is GraphKind.EAGER and self.padded_rows != self.actual_rows:
            raise ValueError("an eager forward is never padded")

    @property
    def padded_rows(self) -> int:
        rows = 1
        for d in self.padded_shape:
            rows *= d
        return rows

    @property
    def padding_rows(self) -> int:
        return self.padded_rows - self.actual_rows


def smallest_bucket_at_least(value: int, buckets: Sequence[int]) -> int | None:
    """The smallest entry of the increasing `buckets` that is >= value, or None if all are smaller."""
    i = bisect.bisect_left(buckets, value)
    return buckets[i] if i < len(buckets) else None


def _eager(forward: ForwardKind, num_requests: int, rows: int) -> GraphChoice:
    return GraphChoice(forward, GraphKind.EAGER, num_requests, rows, (rows,))


def choose_decode_graph(q_lens: Sequence[int], verify_width: int, graphs: GraphConfig) -> GraphChoice:
    """Decode-only forward of len(q_lens) running requests, each captured at `verify_width` rows."""
    if not q_lens:
        raise ValueError("a decode forward needs at least one running request")
    if any(q < 1 or q > verify_width for q in q_lens):
        raise ValueError(f"q_lens {tuple(q_lens)} must lie in [1, verify width {verify_width}]")
    batch = smallest_bucket_at_least(len(q_lens), graphs.decode_batch_sizes)
    rows = sum(q_lens)
    if batch is None:
        return _eager(ForwardKind.DECODE, len(q_lens), rows)
    return GraphChoice(ForwardKind.DECODE, GraphKind.FULL, len(q_lens), rows, (batch, verify_width))


def choose_window_graph(window_rows: Sequence[int], graphs: GraphConfig) -> GraphChoice:
    """Window-only forward of the admitted requests' window rows."""
    if not window_rows:
        raise ValueError("a window forward needs at least one admitted request")
    rows = sum(window_rows)
    bucket = graphs.window_row_bucket
    padded = -(-rows // bucket) * bucket
    if padded > graphs.max_window_graph_rows:
        return _eager(ForwardKind.WINDOW, len(window_rows), rows)
    return GraphChoice(ForwardKind.WINDOW, GraphKind.ROW_BUCKET, len(window_rows), rows, (padded,))


def choose_mixed_graph(num_requests: int, rows: int, graphs: GraphConfig) -> GraphChoice:
    """One forward holding decode rows and window rows."""
    if graphs.mixed_backend is MixedBackend.BREAKABLE:
        padded = smallest_bucket_at_least(rows, graphs.mixed_row_buckets)
        if padded is not None:
            return GraphChoice(ForwardKind.MIXED, GraphKind.BREAKABLE, num_requests, rows, (padded,))
    return _eager(ForwardKind.MIXED, num_requests, rows)


def choose_graphs(plan: StepPlan, config: SchedulerConfig) -> tuple[GraphChoice, ...]:
    """The forwards of a planned step, in execution order (empty for an idle step)."""
    q_lens = [r.q_len for r in plan.decode]
    windows = [w.window_rows for w in plan.admitted]
    if not windows:
        return (choose_decode_graph(q_lens, config.verify_width, config.graphs),) if q_lens else ()
    if not q_lens:
        return (choose_window_graph(windows, config.graphs),)
    if plan.mode is StepMode.SEPARATE:
        return (
            choose_decode_graph(q_lens, config.verify_width, config.graphs),
            choose_window_graph(windows, config.graphs),
        )
    return (choose_mixed_graph(len(q_lens) + len(windows), plan.total_rows, config.graphs),)
