"""plan_step on hand-built scenarios: exact admitted sets, reasons, rows and shapes."""

from __future__ import annotations

import pytest

from sched_bounds import blocked
from sglang_asym.sched import (
    AdmissionDecision,
    AdmitReason,
    InvalidRequestError,
    RunningRequest,
    SchedulerConfig,
    StepShape,
    WaitingRequest,
    plan_step,
)


def running(n: int, q_len: int = 4) -> list[RunningRequest]:
    return [RunningRequest(f"r{i}", q_len) for i in range(n)]


def waiting(*rows: int, arrival: int = 0) -> list[WaitingRequest]:
    return [WaitingRequest(chr(ord("a") + i), r, arrival) for i, r in enumerate(rows)]


TIGHT = SchedulerConfig(token_budget=200, max_window_rows_per_step=256, max_running=8, num_draft_tokens=3,
                        window=128, max_wait_steps=3)


def test_burst_admits_the_prefix_that_fits_the_budget() -> None:
    plan = plan_step(running(4), waiting(128, 128, 50), 0, TIGHT)
    assert [w.request_id for w in plan.admitted] == ["a"]
    assert (plan.decode_rows, plan.window_rows, plan.total_rows) == (16, 128, 144)
    assert plan.decisions == (
        AdmissionDecision("a", 128, 0, AdmitReason.FITS, 184, 256, 4),
        AdmissionDecision("b", 128, 0, AdmitReason.OVER_BUDGET, 56, 128, 3),
    )
    # c (50 rows) would fit the 56 rows left, but FIFO: nobody overtakes b.
    assert blocked(plan) == plan.decisions[1]
    assert plan.shape is StepShape.MIXED and plan.total_rows <= plan.token_budget


def test_head_ages_into_an_over_budget_admission_alone() -> None:
    config = SchedulerConfig(token_budget=100, max_running=8, num_draft_tokens=3, max_wait_steps=3)
    queue = [WaitingRequest("a", 128, 0), WaitingRequest("b", 10, 1)]
    held = plan_step(running(4), queue, 2, config)
    assert held.admitted == () and held.decisions == (AdmissionDecision("a", 128, 2, AdmitReason.OVER_BUDGET, 84, 512, 4),)
    aged = plan_step(running(4), queue, 3, config)
    assert aged.admitted == (queue[0],)
    assert aged.decisions == (
        AdmissionDecision("a", 128, 3, AdmitReason.AGED, 84, 512, 4),
        AdmissionDecision("b", 10, 2, AdmitReason.OVER_BUDGET, -44, 384, 3),
    )
    assert aged.total_rows == 16 + 128 > aged.token_budget


def test_head_goes_over_budget_when_nothing_runs() -> None:
    config = SchedulerConfig(token_budget=32, max_running=8, num_draft_tokens=3, max_wait_steps=100)
    plan = plan_step([], waiting(128, 1), 0, config)
    assert [w.request_id for w in plan.admitted] == ["a"]
    assert [d.reason for d in plan.decisions] == [AdmitReason.NO_DECODE, AdmitReason.OVER_BUDGET]
    assert plan.shape is StepShape.WINDOW_ONLY and plan.total_rows == 128


def test_window_row_bound_stops_admission() -> None:
    config = SchedulerConfig(token_budget=2000, max_window_rows_per_step=200, max_running=8)
    plan = plan_step(running(2), waiting(128, 100, 1), 0, config)
    assert [w.request_id for w in plan.admitted] == ["a"]
    assert blocked(plan) == AdmissionDecision("b", 100, 0, AdmitReason.OVER_WINDOW_BOUND, 2000 - 8 - 128, 72, 5)


def test_full_running_batch_blocks_admission() -> None:
    config = SchedulerConfig(token_budget=2000, max_running=2, max_wait_steps=0)
    plan = plan_step(running(1), waiting(8, 8), 5, config)
    assert [w.request_id for w in plan.admitted] == ["a"]
    assert blocked(plan) == AdmissionDecision("b", 8, 5, AdmitReason.NO_SLOT, 2000 - 4 - 8, 512 - 8, 0)
    full = plan_step(running(2), waiting(8), 5, config)
    assert full.admitted == () and full.shape is StepShape.DECODE_ONLY
    assert blocked(full).reason is AdmitReason.NO_SLOT


def test_admit_all_ignores_budget_and_window_bound_but_not_slots() -> None:
    config = SchedulerConfig(token_budget=12, max_window_rows_per_step=128, max_running=3, policy="admit_all")
    plan = plan_step(running(1), waiting(128, 128, 128), 0, config)
    assert [w.request_id for w in plan.admitted] == ["a", "b"]
    assert [d.reason for d in plan.decisions] == [AdmitReason.ADMIT_ALL, AdmitReason.ADMIT_ALL, AdmitReason.NO_SLOT]
    assert plan.total_rows == 4 + 256


def test_step_shapes_and_idle_step() -> None:
    config = SchedulerConfig()
    assert plan_step(running(3), waiting(128), 0, config).shape is StepShape.MIXED
    assert plan_step(running(3), [], 0, config).shape is StepShape.DECODE_ONLY
    assert plan_step([], waiting(128), 0, config).shape is StepShape.WINDOW_ONLY
    idle = plan_step([], [], 0, config)
    assert idle.shape is StepShape.IDLE and idle.decisions == () and idle.total_rows == 0


def test_zero_max_wait_admits_the_head_every_step() -> None:
    config = SchedulerConfig(token_budget=32, max_running=8, num_draft_tokens=3, max_wait_steps=0)
    plan = plan_step(running(6), waiting(128, 128), 0, config)
    assert [d.reason for d in plan.decisions] == [AdmitReason.AGED, AdmitReason.OVER_BUDGET]
    assert plan.total_rows == 6 * 4 + 128
    # With the seventh slot filled too, the second request finds no slot rather than no budget.
    full = plan_step(running(7), waiting(128, 128), 0, config)
    assert [d.reason for d in full.decisions] == [AdmitReason.AGED, AdmitReason.NO_SLOT]


@pytest.mark.parametrize(
    "run, wait, step, match",
    [
        (running(1), [WaitingRequest("a", 129, 0)], 0, r"'a': window_rows=129 exceeds the window W=128"),
        ([RunningRequest("r", 5)], [], 0, r"'r': q_len=5 exceeds the verify width 1 \+ num_draft_tokens = 4"),
        (running(9), [], 0, r"9 running requests exceed max_running=8"),
        ([RunningRequest("x", 1), RunningRequest("x", 1)], [], 0, r"'x' appears twice among running requests"),
        ([RunningRequest("x", 1)], [WaitingRequest("x", 1, 0)], 0, r"'x' appears twice among running/waiting"),
        ([], [WaitingRequest("a", 1, 3)], 2, r"'a' arrives at step 3, after the planned step 2"),
        ([], [WaitingRequest("a", 1, 2), WaitingRequest("b", 1, 1)], 2, r"not in arrival order: 'b' \(step 1\)"),
    ],
)
def test_plan_step_rejects_inconsistent_views(run, wait, step, match) -> None:
    config = SchedulerConfig(token_budget=200, max_running=8, num_draft_tokens=3)
    with pytest.raises(InvalidRequestError, match=match):
        plan_step(run, wait, step, config)


def test_plan_step_rejects_bad_step() -> None:
    with pytest.raises(ValueError, match=r"step must be an int >= 0, got -1"):
        plan_step([], [], -1, SchedulerConfig())
