"""CUDA-graph shape choice: exact examples and minimal-padding properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sched_strategies import graph_configs, sched_settings
from sglang_asym.sched import (
    ForwardKind,
    GraphChoice,
    GraphConfig,
    GraphKind,
    RunningRequest,
    SchedulerConfig,
    WaitingRequest,
    choose_decode_graph,
    choose_graphs,
    choose_mixed_graph,
    choose_window_graph,
    plan_step,
)

SETTINGS = sched_settings(300)
GRAPHS = GraphConfig(decode_batch_sizes=(1, 2, 4, 8), window_row_bucket=128, max_window_graph_rows=512,
                     mixed_row_buckets=(64, 128, 256, 512))


def test_decode_examples() -> None:
    assert choose_decode_graph([4, 4, 4], 4, GRAPHS) == GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 3, 12, (4, 4))
    assert choose_decode_graph([4, 4, 4], 4, GRAPHS).padding_rows == 4
    # a shorter verify (q_len 2) still occupies the captured width of 4 rows
    short = choose_decode_graph([2, 4], 4, GRAPHS)
    assert (short.kind, short.padded_shape, short.padding_rows) == (GraphKind.FULL, (2, 4), 2)
    eager = choose_decode_graph([1] * 9, 1, GRAPHS)
    assert (eager.kind, eager.padded_shape, eager.padding_rows) == (GraphKind.EAGER, (9,), 0)
    with pytest.raises(ValueError, match="at least one running request"):
        choose_decode_graph([], 4, GRAPHS)
    with pytest.raises(ValueError, match=r"must lie in \[1, verify width 4\]"):
        choose_decode_graph([5], 4, GRAPHS)


def test_window_examples() -> None:
    assert choose_window_graph([128], GRAPHS) == GraphChoice(ForwardKind.WINDOW, GraphKind.ROW_BUCKET, 1, 128, (128,))
    two = choose_window_graph([100, 60], GRAPHS)
    assert (two.kind, two.padded_shape, two.padding_rows) == (GraphKind.ROW_BUCKET, (256,), 96)
    big = choose_window_graph([128] * 4 + [1], GRAPHS)  # 513 rows > 512 captured
    assert (big.kind, big.padded_shape, big.padding_rows) == (GraphKind.EAGER, (513,), 0)


def test_mixed_examples() -> None:
    assert choose_mixed_graph(5, 140, GRAPHS) == GraphChoice(ForwardKind.MIXED, GraphKind.BREAKABLE, 5, 140, (256,))
    assert choose_mixed_graph(5, 600, GRAPHS).kind is GraphKind.EAGER
    eager_cfg = GraphConfig(mixed_backend="eager")
    assert choose_mixed_graph(5, 140, eager_cfg) == GraphChoice(ForwardKind.MIXED, GraphKind.EAGER, 5, 140, (140,))


def test_step_forwards_by_mode() -> None:
    running = [RunningRequest(f"r{i}", 4) for i in range(3)]
    queue = [WaitingRequest("a", 128, 0)]
    mixed = SchedulerConfig(graphs=GRAPHS)
    assert [g.kind for g in choose_graphs(plan_step(running, queue, 0, mixed), mixed)] == [GraphKind.BREAKABLE]
    separate = SchedulerConfig(mode="separate", graphs=GRAPHS)
    forwards = choose_graphs(plan_step(running, queue, 0, separate), separate)
    assert forwards == (
        GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 3, 12, (4, 4)),
        GraphChoice(ForwardKind.WINDOW, GraphKind.ROW_BUCKET, 1, 128, (128,)),
    )
    assert choose_graphs(plan_step([], [], 0, separate), separate) == ()


def test_graph_choice_rejects_impossible_shapes() -> None:
    with pytest.raises(ValueError, match="fewer rows than the 10 actual rows"):
        GraphChoice(ForwardKind.WINDOW, GraphKind.ROW_BUCKET, 1, 10, (8,))
    with pytest.raises(ValueError, match="eager forward is never padded"):
        GraphChoice(ForwardKind.MIXED, GraphKind.EAGER, 1, 10, (16,))


@SETTINGS
@given(graph_configs(), st.integers(0, 7), st.data())
def test_decode_padding_is_the_smallest_captured_batch(graphs, k, data) -> None:
    width = 1 + k
    q_lens = data.draw(st.lists(st.integers(1, width), min_size=1, max_size=20))
    g = choose_decode_graph(q_lens, width, graphs)
    fitting = [b for b in graphs.decode_batch_sizes if b >= len(q_lens)]
    assert g.actual_rows == sum(q_lens) and g.num_requests == len(q_lens)
    if fitting:
        assert g.kind is GraphKind.FULL and g.padded_shape == (min(fitting), width)
        assert g.padding_rows == min(fitting) * width - sum(q_lens) >= 0
    else:
        assert g.kind is GraphKind.EAGER and g.padding_rows == 0


@SETTINGS
@given(graph_configs(), st.lists(st.integers(1, 128), min_size=1, max_size=10))
def test_window_padding_is_the_next_row_bucket_multiple(graphs, windows) -> None:
    g = choose_window_graph(windows, graphs)
    rows, bucket = sum(windows), graphs.window_row_bucket
    if g.kind is GraphKind.ROW_BUCKET:
        (padded,) = g.padded_shape
        assert padded % bucket == 0 and padded - bucket < rows <= padded <= graphs.max_window_graph_rows
    else:
        assert g.kind is GraphKind.EAGER and g.padded_shape == (rows,)
        assert -(-rows // bucket) * bucket > graphs.max_window_graph_rows


@SETTINGS
@given(graph_configs(), st.integers(1, 1500), st.integers(1, 40))
def test_mixed_padding_is_the_smallest_captured_row_bucket(graphs, rows, n) -> None:
    g = choose_mixed_graph(n, rows, graphs)
    fitting = [b for b in graphs.mixed_row_buckets if b >= rows]
    if graphs.mixed_backend.value == "breakable" and fitting:
        assert g.kind is GraphKind.BREAKABLE and g.padded_shape == (min(fitting),)
    else:
        assert g.kind is GraphKind.EAGER and g.padded_shape == (rows,) and g.padding_rows == 0
