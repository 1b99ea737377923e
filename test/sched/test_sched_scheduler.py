"""Scheduler: queue operations, their errors, and exact multi-step scenarios."""

from __future__ import annotations

import pytest

from sched_bounds import max_admission_delay_steps
from sglang_asym.sched import (
    AdmitReason,
    InvalidRequestError,
    QueueFullError,
    RunningRequest,
    Scheduler,
    SchedulerConfig,
    UnknownRequestError,
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
    assert s.waiting == () and [r.request_id for r in s.running] == ["a", "b"]


def test_finish_and_its_errors() -> None:
    s = Scheduler(SchedulerConfig(max_running=1))
    s.enqueue("a", 10)
    s.enqueue("b", 10)
    s.step()
    assert s.running == (RunningRequest("a", 4),) and [w.request_id for w in s.waiting] == ["b"]
    with pytest.raises(UnknownRequestError, match=r"cannot finish 'b': it is still waiting, not running"):
        s.finish("b")
    with pytest.raises(UnknownRequestError, match=r"cannot finish 'zz': it is unknown, not running"):
        s.finish("zz")
    s.finish("a")
    assert s.running == () and [w.request_id for w in s.waiting] == ["b"]


def test_idle_step_returns_none_and_does_not_advance() -> None:
    s = Scheduler(SchedulerConfig())
    assert s.step() is None and s.next_step == 0
    s.enqueue("a", 3)
    assert s.enqueue("b", 3).arrival_step == 0
    first = s.step()
    assert first is not None and first.step == 0 and s.next_step == 1


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
        rows.append(step.total_rows)
        admitted.append(len(step.admitted))
    # 16 running * 4 rows = 64; (512 - 64) // 128 = 3 windows per step, and 3 more decode rows each.
    assert admitted == [3, 3, 2, 0]
    assert rows == [64 + 384, 76 + 384, 88 + 256, 96]
    spike = baseline.step()
    assert len(spike.admitted) == 8 and spike.total_rows == 64 + 8 * 128


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
        for d in step.decisions:
            if d.admitted:
                assert d.reason is AdmitReason.AGED
                admitted_at[d.request_id] = step.step
    assert admitted_at == {"w0": 4, "w1": 5, "w2": 6, "w3": 7}
    for i in range(4):  # enqueued before step 1
        assert admitted_at[f"w{i}"] - 1 == max_admission_delay_steps(config, requests_ahead=i) == 3 + i
    assert max_admission_delay_steps(config) == 3 + 3
