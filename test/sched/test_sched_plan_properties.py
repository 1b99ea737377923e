"""Properties of plan_step over generated configs and queues (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sched_bounds import blocked as blocked_by, max_rows_per_step
from sched_strategies import configs, sched_settings, step_states
from sglang_asym.sched import AdmitReason, StepShape, plan_step

SETTINGS = sched_settings(400)


@SETTINGS
@given(step_states())
def test_running_always_decode_and_admission_is_a_fifo_prefix(state) -> None:
    config, running, waiting, step = state
    plan = plan_step(running, waiting, step, config)
    assert plan.decode == tuple(running)  # decode is never starved, order kept
    n = len(plan.admitted)
    assert plan.admitted == tuple(waiting[:n])
    assert [d.request_id for d in plan.decisions[:n]] == [w.request_id for w in plan.admitted]
    assert all(d.admitted for d in plan.decisions[:n])
    if n < len(waiting):  # exactly one decision explains why the queue stopped
        assert len(plan.decisions) == n + 1
        assert blocked_by(plan) is not None and blocked_by(plan).request_id == waiting[n].request_id
        assert not blocked_by(plan).reason.admits
    else:
        assert len(plan.decisions) == n and blocked_by(plan) is None
    assert len(running) + n <= config.max_running


@SETTINGS
@given(step_states(configs(policy="budget")))
def test_budget_policy_respects_budget_except_the_lone_forced_head(state) -> None:
    config, running, waiting, step = state
    plan = plan_step(running, waiting, step, config)
    decode_rows = sum(r.q_len for r in running)
    assert plan.window_rows <= config.max_window_rows_per_step
    assert plan.total_rows <= max_rows_per_step(config)
    assert plan.total_rows <= max(config.token_budget, (config.max_running - 1) * config.verify_width + config.window)
    forced = [d for d in plan.decisions if d.admitted and d.reason in (AdmitReason.AGED, AdmitReason.NO_DECODE)]
    if plan.total_rows > config.token_budget:
        head = waiting[0]
        assert plan.admitted == (head,)
        assert plan.total_rows == decode_rows + head.window_rows
        assert len(forced) == 1 and forced[0].request_id == head.request_id
        assert (forced[0].reason is AdmitReason.NO_DECODE) == (not running)
        assert not running or head.age(step) >= config.max_wait_steps
    else:
        assert forced == []


@SETTINGS
@given(step_states(configs(policy="budget")))
def test_budget_policy_admits_greedily(state) -> None:
    config, running, waiting, step = state
    plan = plan_step(running, waiting, step, config)
    blocked = blocked_by(plan)
    if blocked is None:
        return
    nxt = waiting[len(plan.admitted)]
    if blocked.reason is AdmitReason.NO_SLOT:
        assert len(running) + len(plan.admitted) == config.max_running
        return
    # Not admitted for rows: it really does not fit, and it may not go over the budget either.
    assert len(running) + len(plan.admitted) < config.max_running
    over_budget = nxt.window_rows > config.token_budget - plan.total_rows
    over_bound = nxt.window_rows > config.max_window_rows_per_step - plan.window_rows
    assert over_budget or over_bound
    assert (blocked.reason is AdmitReason.OVER_WINDOW_BOUND) == over_bound
    if not plan.admitted:  # it is the head: it must not be due for a forced admission
        assert running and nxt.age(step) < config.max_wait_steps


@SETTINGS
@given(step_states(configs(policy="budget")))
def test_due_head_is_admitted_whenever_a_slot_is_free(state) -> None:
    config, running, waiting, step = state
    plan = plan_step(running, waiting, step, config)
    if waiting and len(running) < config.max_running:
        if not running or waiting[0].age(step) >= config.max_wait_steps:
            assert plan.admitted[:1] == (waiting[0],)


@SETTINGS
@given(step_states(configs(policy="admit_all")))
def test_admit_all_admits_everything_that_has_a_slot(state) -> None:
    config, running, waiting, step = state
    plan = plan_step(running, waiting, step, config)
    free = config.max_running - len(running)
    assert plan.admitted == tuple(waiting[:free])
    assert all(d.reason is AdmitReason.ADMIT_ALL for d in plan.decisions[: len(plan.admitted)])


@SETTINGS
@given(step_states())
def test_shape_names_the_rows_the_plan_holds(state) -> None:
    config, running, waiting, step = state
    plan = plan_step(running, waiting, step, config)
    expected = {(False, False): StepShape.IDLE, (True, False): StepShape.DECODE_ONLY,
                (False, True): StepShape.WINDOW_ONLY, (True, True): StepShape.MIXED}
    assert plan.shape is expected[bool(plan.decode), bool(plan.admitted)]
    assert plan.total_rows == sum(r.q_len for r in plan.decode) + sum(w.window_rows for w in plan.admitted)


@sched_settings(100)
@given(step_states(configs(policy="budget")), st.integers(1, 5))
def test_plan_is_a_pure_function_of_its_inputs(state, later) -> None:
    config, running, waiting, step = state
    assert plan_step(running, waiting, step, config) == plan_step(list(running), list(waiting), step, config)
    # Waiting longer never admits fewer requests (aging only helps).
    assert len(plan_step(running, waiting, step + later, config).admitted) >= len(
        plan_step(running, waiting, step, config).admitted)
