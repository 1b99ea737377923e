"""Chunked windows (SchedulerConfig.window_chunk): chunks sized to the budget left, the budget never
exceeded, the queue head always progresses, one request finishes its window before the next starts,
and every request's window completes within max_admission_delay_steps (hypothesis + examples)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sched_bounds import blocked as blocked_by, max_admission_delay_steps, max_rows_per_step, min_chunk_rows
from sched_strategies import configs, operations, sched_settings
from sglang_asym.sched import (
    AdmitReason,
    RunningRequest,
    Scheduler,
    SchedulerConfig,
    WaitingRequest,
    plan_step,
)

SETTINGS = sched_settings(400)


@st.composite
def chunked_configs(draw) -> SchedulerConfig:
    config = draw(configs(policy="budget"))
    return replace(config, window_chunk=draw(st.integers(1, config.window)))


@st.composite
def chunked_states(draw):
    """(config, running, waiting, step); the head may be part-way through its window."""
    config = draw(chunked_configs())
    step = draw(st.integers(1, 30))
    running = [RunningRequest(f"run{i}", draw(st.integers(1, config.verify_width)))
               for i in range(draw(st.integers(0, config.max_running)))]
    arrivals = sorted(draw(st.lists(st.integers(0, step - 1), max_size=config.max_waiting)))
    waiting = [WaitingRequest(f"wait{i}", draw(st.integers(1, config.window)), arrival)
               for i, arrival in enumerate(arrivals)]
    if waiting and draw(st.booleans()):
        waiting[0] = replace(waiting[0], last_chunk_step=draw(st.integers(waiting[0].arrival_step, step - 1)))
    return config, running, waiting, step


@SETTINGS
@given(chunked_states())
def test_chunked_steps_stay_within_the_budget_and_admit_a_fifo_prefix(state) -> None:
    config, running, waiting, step = state
    plan = plan_step(running, waiting, step, config)
    assert plan.decode == tuple(running)
    assert plan.total_rows <= config.token_budget == max_rows_per_step(config)
    assert plan.window_rows <= config.max_window_rows_per_step
    n = len(plan.admitted)
    assert [w.request_id for w in plan.admitted] == [w.request_id for w in waiting[:n]]
    for piece, whole in zip(plan.admitted, waiting):
        assert 1 <= piece.window_rows <= min(whole.window_rows, config.window_chunk)
    # only the last admitted request may be partial, and admission stops at it
    assert all(piece.window_rows == whole.window_rows for piece, whole in zip(plan.admitted[:-1], waiting))
    if plan.partial:
        assert plan.partial == (plan.admitted[-1].request_id,) and len(plan.decisions) == n
    assert not any(d.reason in (AdmitReason.AGED, AdmitReason.NO_DECODE) for d in plan.decisions)  # over budget
    assert len(running) + n <= config.max_running


@SETTINGS
@given(chunked_states())
def test_the_head_progresses_whenever_a_slot_is_free(state) -> None:
    config, running, waiting, step = state
    plan = plan_step(running, waiting, step, config)
    if waiting and len(running) < config.max_running:
        head = waiting[0]
        assert plan.admitted and plan.admitted[0].request_id == head.request_id
        assert plan.admitted[0].window_rows >= min(head.window_rows, min_chunk_rows(config))
    blocked = blocked_by(plan)
    if blocked is not None and blocked.reason is not AdmitReason.NO_SLOT:  # greedy: nothing was left
        assert blocked.budget_left < 1 or blocked.window_rows_left < 1


def _run(config: SchedulerConfig, script):
    """Drive a Scheduler; check per step and record when each request's window completed."""
    s = Scheduler(config)
    arrival, completed, rows_run, full_steps, partial = {}, {}, {}, [], []

    def step() -> None:
        before_running, before_waiting = s.running, s.waiting
        plan = s.step()
        if plan is None:
            assert not before_running and not before_waiting
            return
        if len(before_running) == config.max_running:
            full_steps.append(plan.step)
        assert plan.total_rows <= config.token_budget
        # at most the head is part-way through its window, before and after the step
        assert all(w.last_chunk_step is None for w in s.waiting[1:])
        partial.extend(plan.partial)
        for piece in plan.admitted:
            rows_run[piece.request_id] = rows_run.get(piece.request_id, 0) + piece.window_rows
            if piece.request_id not in plan.partial:
                completed[piece.request_id] = plan.step
                assert any(r.request_id == piece.request_id for r in s.running)

    windows = {}
    for n, (op, arg) in enumerate(script):
        if op == "enqueue" and len(s.waiting) < config.max_waiting:
            rid = f"q{n}"
            arrival[rid] = (s.next_step, len(s.waiting))
            windows[rid] = arg
            s.enqueue(rid, arg)
        elif op == "step":
            step()
        elif op == "finish" and s.running:
            s.finish(s.running[arg % len(s.running)].request_id)
    while s.waiting:
        if len(s.running) == config.max_running:
            s.finish(s.running[0].request_id)
        step()
    return s, arrival, completed, rows_run, windows, full_steps, len(partial)


@sched_settings(250)
@given(st.data())
def test_every_window_completes_within_the_bound_in_fifo_order(data) -> None:
    config = data.draw(chunked_configs())
    s, arrival, completed, rows_run, windows, full_steps, chunks = _run(config, data.draw(operations(config)))
    assert set(completed) == set(windows)
    for rid, at in completed.items():
        assert rows_run[rid] == windows[rid]  # every row of the window ran exactly once
        start, ahead = arrival[rid]
        full = sum(1 for t in full_steps if start <= t <= at)
        assert at - start <= max_admission_delay_steps(config, ahead) + full
    order = sorted(completed, key=lambda rid: (completed[rid], arrival[rid]))
    assert order == sorted(completed, key=lambda rid: arrival[rid])
    assert chunks >= sum(-(-rows // config.window_chunk) - 1 for rows in windows.values())


def test_a_burst_runs_one_window_after_the_other_in_budget_sized_chunks() -> None:
    config = SchedulerConfig(token_budget=48, max_window_rows_per_step=128, max_running=24, num_draft_tokens=0,
                             window=128, window_chunk=32)
    s = Scheduler(config)
    for i in range(16):
        s.add_running(f"run{i}")
    s.enqueue("a", 128)
    s.enqueue("b", 100)
    shapes = []
    while s.waiting:
        plan = s.step()
        shapes.append([(w.request_id, w.window_rows) for w in plan.admitted])
        assert plan.total_rows <= 48
    # a: four chunks of 32 (16 decode rows leave 32); then 17 decode rows leave 31 for b
    assert shapes == [[("a", 32)], [("a", 32)], [("a", 32)], [("a", 32)], [("b", 31)], [("b", 31)],
                      [("b", 31)], [("b", 7)]]
    decision = plan_step(s.running, [WaitingRequest("c", 100, 8, last_chunk_step=None)], 8, config).decisions[0]
    assert decision.reason is AdmitReason.CHUNK and decision.chunk_rows == 30


def test_chunked_config_and_views_are_validated() -> None:
    with pytest.raises(ValueError, match="window_chunk"):
        SchedulerConfig(window=128, window_chunk=129, num_draft_tokens=0)
    with pytest.raises(ValueError, match="window_chunk"):
        SchedulerConfig(window=128, window_chunk=0, num_draft_tokens=0)
    with pytest.raises(ValueError, match="last_chunk_step"):
        WaitingRequest("a", 5, 3, last_chunk_step=2)
    unchunked = SchedulerConfig(num_draft_tokens=0)
    with pytest.raises(ValueError, match="not chunked"):
        plan_step([], [WaitingRequest("a", 5, 0, last_chunk_step=1)], 4, unchunked)
    with pytest.raises(ValueError, match="chunked windows"):
        min_chunk_rows(unchunked)


# ---- deterministic inference: chunks at fixed boundaries -------------------------------------------------
def _det_plan(deterministic: bool):
    """4 decode rows of budget 20 leave 16: w1 (8 rows) and w2 (7) fit whole, w3 finds 1 row left."""
    from sglang_asym.sched import SchedulerConfig
    from sglang_asym.sched.plan import plan_step
    from sglang_asym.sched.request_views import RunningRequest, WaitingRequest

    running = [RunningRequest(f"r{i}", q_len=1) for i in range(4)]
    waiting = [WaitingRequest("w1", 8, 0), WaitingRequest("w2", 7, 0), WaitingRequest("w3", 100, 0)]
    config = SchedulerConfig(token_budget=20, max_window_rows_per_step=128, max_running=8, num_draft_tokens=0,
                             window=128, window_chunk=8, deterministic=deterministic)
    return plan_step(running, waiting, 0, config)


def test_deterministic_chunks_wait_instead_of_shrinking():
    from sglang_asym.sched.plan import AdmitReason

    cut = _det_plan(False)
    assert [(a.request_id, a.window_rows) for a in cut.admitted] == [("w1", 8), ("w2", 7), ("w3", 1)]
    held = _det_plan(True)
    assert [(a.request_id, a.window_rows) for a in held.admitted] == [("w1", 8), ("w2", 7)]
    assert held.decisions[-1].reason is AdmitReason.OVER_BUDGET


def test_deterministic_chunks_need_room_for_the_head_chunk():
    from sglang_asym.sched import SchedulerConfig

    with pytest.raises(ValueError, match=r"token_budget - \(max_running - 1\) \* \(1 \+ k\) = 7 >= window_chunk \(8\)"):
        SchedulerConfig(token_budget=14, max_window_rows_per_step=128, max_running=8, num_draft_tokens=0,
                        window=128, window_chunk=8, deterministic=True)
    assert SchedulerConfig(token_budget=14, max_window_rows_per_step=128, max_running=8, num_draft_tokens=0,
                           window=128, window_chunk=7, deterministic=True).deterministic
