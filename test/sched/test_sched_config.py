"""SchedulerConfig / GraphConfig validation and request-view validation: bad input names what is wrong."""

from __future__ import annotations

import pytest

from sglang_asym.sched import (
    AdmitPolicy,
    GraphConfig,
    InvalidRequestError,
    MixedBackend,
    RunningRequest,
    SchedulerConfig,
    StepMode,
    WaitingRequest,
    max_admission_delay_steps,
    max_rows_per_step,
)


def test_defaults_are_consistent() -> None:
    c = SchedulerConfig()
    assert (c.token_budget, c.max_window_rows_per_step, c.max_running, c.num_draft_tokens, c.window) == (
        1024, 512, 64, 3, 128)
    assert c.verify_width == 4
    assert c.mode is StepMode.MIXED and c.policy is AdmitPolicy.BUDGET
    assert c.graphs.decode_batch_sizes[:6] == (1, 2, 4, 8, 12, 16) and c.graphs.decode_batch_sizes[-1] == 256
    assert c.graphs.mixed_row_buckets[0] == 16 and c.graphs.mixed_row_buckets[-1] == 4096


def test_strings_are_coerced_to_enums() -> None:
    c = SchedulerConfig(mode="separate", policy="admit_all", graphs=GraphConfig(mixed_backend="eager"))
    assert c.mode is StepMode.SEPARATE
    assert c.policy is AdmitPolicy.ADMIT_ALL
    assert c.graphs.mixed_backend is MixedBackend.EAGER


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
        ({"mode": "interleaved"}, ValueError, r"mode must be one of \['mixed', 'separate'\], got 'interleaved'"),
        ({"policy": "fifo"}, ValueError, r"policy must be one of \['budget', 'admit_all'\]"),
        ({"max_wait_steps": -1}, ValueError, r"max_wait_steps must be >= 0"),
        ({"max_waiting": 0}, ValueError, r"max_waiting must be >= 1"),
        ({"wait_timeout_s": 0.0}, ValueError, r"wait_timeout_s must be None or a finite number > 0"),
        ({"wait_timeout_s": float("inf")}, ValueError, r"wait_timeout_s must be None or a finite number > 0"),
        ({"graphs": None}, TypeError, r"graphs must be a GraphConfig"),
    ],
)
def test_scheduler_config_rejects(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"decode_batch_sizes": (1, 4, 4)}, ValueError, r"decode_batch_sizes must be strictly increasing"),
        ({"decode_batch_sizes": [1, 2]}, TypeError, r"decode_batch_sizes must be a tuple"),
        ({"decode_batch_sizes": (0, 2)}, ValueError, r"decode_batch_sizes\[...\] must be >= 1"),
        ({"window_row_bucket": 0}, ValueError, r"window_row_bucket must be >= 1"),
        ({"max_window_graph_rows": 200}, ValueError, r"max_window_graph_rows \(200\) must be a multiple of window_row_bucket \(128\)"),
        ({"mixed_backend": "full"}, ValueError, r"mixed_backend must be one of \['breakable', 'eager'\]"),
        ({"mixed_row_buckets": (64, 32)}, ValueError, r"mixed_row_buckets must be strictly increasing"),
    ],
)
def test_graph_config_rejects(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        GraphConfig(**kwargs)


def test_empty_bucket_lists_mean_no_graphs() -> None:
    g = GraphConfig(decode_batch_sizes=(), max_window_graph_rows=0, mixed_row_buckets=())
    assert g.decode_batch_sizes == () and g.max_window_graph_rows == 0


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: RunningRequest("", 1), r"non-empty str request_id"),
        (lambda: RunningRequest("a", 0), r"running request 'a': q_len must be an int >= 1, got 0"),
        (lambda: WaitingRequest("w", 0, 0), r"waiting request 'w': window_rows must be >= 1, got 0"),
        (lambda: WaitingRequest("w", 1.5, 0), r"window_rows must be an int"),
        (lambda: WaitingRequest("w", 1, -1), r"arrival_step must be an int >= 0"),
        (lambda: WaitingRequest("w", 1, 0, float("nan")), r"arrival_time must be finite"),
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
