"""SchedulerConfig validation and request-view validation: bad input names what is wrong."""

from __future__ import annotations

import pytest

from sched_bounds import max_admission_delay_steps, max_rows_per_step
from sglang_asym.sched import (
    AdmitPolicy,
    InvalidRequestError,
    RunningRequest,
    SchedulerConfig,
    WaitingRequest,
)


def test_defaults_are_consistent() -> None:
    c = SchedulerConfig()
    assert (c.token_budget, c.max_window_rows_per_step, c.max_running, c.num_draft_tokens, c.window) == (
        1024, 512, 64, 3, 128)
    assert c.verify_width == 4
    assert c.policy is AdmitPolicy.BUDGET


def test_strings_are_coerced_to_enums() -> None:
    assert SchedulerConfig(policy="admit_all").policy is AdmitPolicy.ADMIT_ALL


def test_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        SchedulerConfig().token_budget = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_draft_tokens": 8}, ValueError, r"num_draft_tokens must be <= 7"),
        ({"num_draft_tokens": -1}, ValueError, r"num_draft_tokens must be >= 0"),
        ({"num_draft_tokens": 2.0}, TypeError, r"num_draft_tokens must be an int"),
        ({"token_budget": True}, TypeError, r"token_budget must be an int, got bool"),
        ({"token_budget": 0}, ValueError, r"token_budget must be >= 1"),
        ({"token_budget": 255}, ValueError, r"token_budget \(255\) must be >= max_running \* \(1 \+ num_draft_tokens\) = 64 \* 4 = 256"),
        ({"max_running": 0}, ValueError, r"max_running must be >= 1"),
        ({"window": 0}, ValueError, r"window must be >= 1"),
        ({"max_window_rows_per_step": 127}, ValueError, r"max_window_rows_per_step \(127\) must be >= window \(128\)"),
        ({"policy": "fifo"}, ValueError, r"policy must be one of \['budget', 'admit_all'\]"),
        ({"max_wait_steps": -1}, ValueError, r"max_wait_steps must be >= 0"),
        ({"max_waiting": 0}, ValueError, r"max_waiting must be >= 1"),
    ],
)
def test_scheduler_config_rejects(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: RunningRequest("", 1), r"non-empty str request_id"),
        (lambda: RunningRequest("a", 0), r"running request 'a': q_len must be an int >= 1, got 0"),
        (lambda: WaitingRequest("w", 0, 0), r"waiting request 'w': window_rows must be >= 1, got 0"),
        (lambda: WaitingRequest("w", 1.5, 0), r"window_rows must be an int"),
        (lambda: WaitingRequest("w", 1, -1), r"arrival_step must be an int >= 0"),
    ],
)
def test_request_views_reject(make, match) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        make()


def test_bounds_from_config() -> None:
    c = SchedulerConfig(token_budget=300, max_running=8, num_draft_tokens=3, max_wait_steps=5, max_waiting=10)
    # forced head: 7 running * 4 rows + a full 128-row window = 156 < 300
    assert max_rows_per_step(c) == 300
    tight = SchedulerConfig(token_budget=40, max_running=8, num_draft_tokens=3, max_window_rows_per_step=128)
    assert max_rows_per_step(tight) == 7 * 4 + 128
    assert max_admission_delay_steps(c) == 5 + 9
    assert max_admission_delay_steps(c, requests_ahead=0) == 5
    assert max_admission_delay_steps(SchedulerConfig(policy="admit_all", max_waiting=10), requests_ahead=3) == 3
    with pytest.raises(ValueError, match=r"requests_ahead must be an int in \[0, max_waiting=10\), got 10"):
        max_admission_delay_steps(c, requests_ahead=10)
    with pytest.raises(ValueError, match="budget policy only"):
        max_rows_per_step(SchedulerConfig(policy="admit_all"))
