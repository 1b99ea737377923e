"""Scheduler: queue operations, error results, debug log, and exact multi-step scenarios."""

from __future__ import annotations

import logging

import pytest

from sglang_asym.sched import (
    AdmitReason,
    GraphKind,
    InvalidRequestError,
    QueueFullError,
    RequestState,
    RunningRequest,
    Scheduler,
    SchedulerConfig,
    StepShape,
    UnknownRequestError,
    WaitTimeout,
    max_admission_delay_steps,
)


def test_enqueue_rejects_bad_requests() -> None:
    s = Scheduler(SchedulerConfig(window=128, max_waiting=2))
    with pytest.raises(InvalidRequestError, match=r"'big': window_rows=129 exceeds the window W=128"):
        s.enqueue("big", 129)
    with pytest.raises(InvalidRequestError, match=r"'empty': window_rows must be >= 1, got 0"):
        s.enqueue("empty", 0)
    s.enqueue("a", 128)
    with pytest.raises(InvalidRequestError, match=r"request 'a' is already waiting"):
        s.enqueue("a", 5)
    s.enqueue("b", 1)
    with pytest.raises(QueueFullError, match=r"cannot enqueue 'c': waiting queue is full \(max_waiting=2\)"):
        s.enqueue("c", 1)
    s.step()
    with pytest.raises(InvalidRequestError, match=r"request 'a' is already running"):
        s.enqueue("a", 5)
    assert s.counters.enqueued == 2 and s.waiting == ()


def test_finish_abort_and_their_errors() -> None:
    s = Scheduler(SchedulerConfig(max_running=1))
    s.enqueue("a", 10)
    s.enqueue("b", 10)
    s.step()
    assert s.running == (RunningRequest("a", 4),) and [w.request_id for w in s.waiting] == ["b"]
    with pytest.raises(UnknownRequestError, match=r"cannot finish 'b': it is still waiting \(use abort\), not running"):
        s.finish("b")
    with pytest.raises(UnknownRequestError, match=r"cannot finish 'zz': it is unknown, not running"):
        s.finish("zz")
    assert s.abort("b") is RequestState.WAITING
    assert s.abort("a") is RequestState.RUNNING
    with pytest.raises(UnknownRequestError, match=r"cannot abort 'a': it is neither waiting nor running"):
        s.abort("a")
    c = s.counters
    assert (c.aborted_waiting, c.aborted_running, c.finished) == (1, 1, 0)


def test_idle_step_returns_none_and_does_not_advance() -> None:
    s = Scheduler(SchedulerConfig())
    assert s.step() is None and s.next_step == 0 and s.counters.steps == 0
    s.enqueue("a", 3)
    assert s.enqueue("b", 3).arrival_step == 0
    first = s.step()
    assert first is not None and first.plan.step == 0 and s.next_step == 1


def test_expire_returns_clear_error_results() -> None:
    s = Scheduler(SchedulerConfig(wait_timeout_s=5.0, max_running=1))
    s.enqueue("run", 8, arrival_time=0.0)
    s.step()  # 'run' takes the only slot, so the others keep waiting
    s.enqueue("a", 8, arrival_time=1.0)
    s.enqueue("b", 8, arrival_time=3.0)
    s.step()
    assert s.expire(6.0) == ()  # a waited exactly 5 s: not longer than the limit
    expired = s.expire(7.5)
    assert expired == (WaitTimeout("a", 6.5, 1, 5.0, 0),)
    assert expired[0].message == (
        "request 'a' timed out waiting for its window step: waited 6.500 s > wait_timeout_s=5.0 "
        "(1 steps, position 0 in queue)"
    )
    assert [w.request_id for w in s.waiting] == ["b"] and s.counters.timed_out == 1
    assert Scheduler(SchedulerConfig()).expire(1e9) == ()  # no timeout configured
    with pytest.raises(ValueError, match=r"expire\(\) needs a finite time, got nan"):
        s.expire(float("nan"))


def test_burst_keeps_steps_within_budget_while_admit_all_spikes() -> None:
    common = dict(token_budget=512, max_window_rows_per_step=512, max_running=32, num_draft_tokens=3, max_wait_steps=8)
    budget, baseline = Scheduler(SchedulerConfig(**common)), Scheduler(SchedulerConfig(policy="admit_all", **common))
    for s in (budget, baseline):
        for i in range(16):
            s.enqueue(f"old{i}", 128)
        while s.waiting:
            s.step()
        for i in range(8):  # the burst
            s.enqueue(f"new{i}", 128)
    rows, admitted = [], []
    for _ in range(4):
        step = budget.step()
        rows.append(step.plan.total_rows)
        admitted.append(len(step.plan.admitted))
    # 16 running * 4 rows = 64; (512 - 64) // 128 = 3 windows per step, and 3 more decode rows each.
    assert admitted == [3, 3, 2, 0]
    assert rows == [64 + 384, 76 + 384, 88 + 256, 96]
    spike = baseline.step()
    assert len(spike.plan.admitted) == 8 and spike.plan.total_rows == 64 + 8 * 128
    assert (spike.graphs[0].kind, spike.graphs[0].padded_shape) == (GraphKind.BREAKABLE, (1280,))


def test_admission_delay_bound_is_attained() -> None:
    # Windows never fit next to the running batch, so each request is admitted only by aging,
    # one per step: request i (i ahead of it) waits exactly max_wait_steps + i steps.
    config = SchedulerConfig(token_budget=40, max_running=10, num_draft_tokens=3, max_wait_steps=3, max_waiting=4)
    s = Scheduler(config)
    s.enqueue("seed", 1)
    s.step()
    for i in range(4):
        s.enqueue(f"w{i}", 128)
    admitted_at = {}
    for _ in range(8):
        step = s.step()
        for d in step.plan.decisions:
            if d.admitted:
                assert d.reason is AdmitReason.AGED
                admitted_at[d.request_id] = step.plan.step
    assert admitted_at == {"w0": 4, "w1": 5, "w2": 6, "w3": 7}
    for i in range(4):  # enqueued before step 1
        assert admitted_at[f"w{i}"] - 1 == max_admission_delay_steps(config, requests_ahead=i) == 3 + i
    assert max_admission_delay_steps(config) == 3 + 3


def test_counters_by_shape_and_graph_kind() -> None:
    config = SchedulerConfig(mode="separate", max_running=4, token_budget=200)
    s = Scheduler(config)
    s.enqueue("a", 128)
    s.step()  # window only
    s.enqueue("b", 64)
    s.step()  # decode a, then window b
    s.step()  # decode only
    c = s.counters
    assert c.steps == 3
    assert dict(c.steps_by_shape) == {StepShape.DECODE_ONLY: 1, StepShape.WINDOW_ONLY: 1, StepShape.MIXED: 0,
                                      StepShape.DECODE_THEN_WINDOW: 1}
    assert dict(c.forwards_by_graph) == {GraphKind.FULL: 2, GraphKind.ROW_BUCKET: 2, GraphKind.BREAKABLE: 0,
                                         GraphKind.EAGER: 0}
    # windows 128 -> 128 and 64 -> 128; decode batches of 1 and 2 at width 4 (buckets 1 and 2)
    assert (c.decode_rows, c.window_rows, c.padding_rows) == (4 + 8, 192, 64)
    assert (c.enqueued, c.admitted, c.steps_over_budget) == (2, 2, 0)


def test_debug_log_explains_each_decision(caplog) -> None:
    config = SchedulerConfig(token_budget=200, max_window_rows_per_step=256, max_running=8, max_wait_steps=3)
    s = Scheduler(config)
    s.enqueue("r0", 8)
    s.step()
    for name, rows in (("a", 128), ("b", 128), ("c", 50)):
        s.enqueue(name, rows)
    with caplog.at_level(logging.DEBUG, logger="sglang_asym.sched.scheduler"):
        s.step()
    assert [r.getMessage() for r in caplog.records] == [
        "step 1 mixed: decode 1 req / 4 rows, admit 1 req / 128 rows, total 132 of 200; "
        "forwards [mixed:breakable 132->144 rows[144]]",
        "step 1: admit 'a' (128 window rows, waited 0 steps): fits, 196 of token budget 200 left, 256 window rows left",
        "step 1: hold 'b' (128 window rows, waited 0 steps) and 1 behind it: needs 128 rows, 68 of token budget 200 "
        "left; at the head it is admitted anyway in 3 steps",
    ]
