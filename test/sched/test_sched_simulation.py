"""Scheduler driven by generated operation scripts: admission bound, FIFO, decode never starved."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from sched_bounds import max_admission_delay_steps, max_rows_per_step
from sched_strategies import configs, operations, sched_settings
from sglang_asym.sched import (
    AdmitPolicy,
    QueueFullError,
    RunningRequest,
    Scheduler,
    SchedulerConfig,
)


@dataclass
class Trace:
    """What the test saw, kept independently of the scheduler."""

    arrival: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (arrival step, requests ahead)
    admitted_at: dict[str, int] = field(default_factory=dict)
    enqueue_order: list[str] = field(default_factory=list)
    admit_order: list[str] = field(default_factory=list)
    full_steps: list[int] = field(default_factory=list)  # steps planned with no free running slot


def do_step(s: Scheduler, trace: Trace) -> bool:
    config = s.config
    before_running, before_waiting = s.running, s.waiting
    plan = s.step()
    if plan is None:
        assert not before_running and not before_waiting  # never idle while someone waits
        return False
    if len(before_running) == config.max_running:
        trace.full_steps.append(plan.step)
    assert plan.decode == before_running  # every running request decodes, every step
    assert plan.admitted == before_waiting[: len(plan.admitted)]
    assert s.running == before_running + tuple(RunningRequest(w.request_id, config.verify_width) for w in plan.admitted)
    if config.policy is AdmitPolicy.BUDGET:
        assert plan.window_rows <= config.max_window_rows_per_step
        assert plan.total_rows <= max_rows_per_step(config)
        if plan.total_rows > config.token_budget:
            assert plan.admitted == before_waiting[:1]
    for w in plan.admitted:
        trace.admitted_at[w.request_id] = plan.step
        trace.admit_order.append(w.request_id)
    return True


def run_script(config: SchedulerConfig, script) -> tuple[Scheduler, Trace]:
    s, trace = Scheduler(config), Trace()
    for n, (op, arg) in enumerate(script):
        if op == "enqueue":
            rid = f"q{n}"
            if len(s.waiting) == config.max_waiting:
                try:
                    s.enqueue(rid, arg)
                    raise AssertionError("enqueue on a full queue must fail")
                except QueueFullError:
                    continue
            trace.arrival[rid] = (s.next_step, len(s.waiting))
            trace.enqueue_order.append(rid)
            assert s.enqueue(rid, arg).arrival_step == s.next_step
        elif op == "step":
            do_step(s, trace)
        elif op == "finish" and s.running:
            s.finish(s.running[arg % len(s.running)].request_id)
    # Drain: free a slot whenever the batch is full; the queue must then empty within the bound.
    drain_start, left = s.next_step, len(s.waiting)
    while s.waiting:
        if len(s.running) == config.max_running:
            s.finish(s.running[0].request_id)
        assert do_step(s, trace)
        aging = config.max_wait_steps if config.policy is AdmitPolicy.BUDGET else 0
        assert s.next_step - drain_start <= aging + left
    return s, trace


@sched_settings(250)
@given(st.data())
def test_every_request_is_admitted_within_the_bound(data) -> None:
    config = data.draw(configs())
    _, trace = run_script(config, data.draw(operations(config)))
    aging = config.max_wait_steps if config.policy is AdmitPolicy.BUDGET else 0
    for rid, step in trace.admitted_at.items():
        arrival, ahead = trace.arrival[rid]
        full = sum(1 for t in trace.full_steps if arrival <= t <= step)
        assert step - arrival <= aging + ahead + full
        assert step - arrival <= max_admission_delay_steps(config, ahead) + full
        if full == 0:
            assert step - arrival <= max_admission_delay_steps(config)


@sched_settings(250)
@given(st.data())
def test_fifo_order_and_every_request_admitted_once(data) -> None:
    config = data.draw(configs())
    _, trace = run_script(config, data.draw(operations(config)))
    assert trace.admit_order == trace.enqueue_order  # the drain leaves nobody waiting


@sched_settings(100)
@given(configs(policy="admit_all"), st.integers(1, 16))
def test_admit_all_admits_the_whole_queue_in_one_step(config, n) -> None:
    s = Scheduler(config)
    n = min(n, config.max_waiting)
    for i in range(n):
        s.enqueue(f"q{i}", config.window)
    step = s.step()
    assert len(step.admitted) == min(n, config.max_running)
    assert [w.request_id for w in s.waiting] == [f"q{i}" for i in range(min(n, config.max_running), n)]
