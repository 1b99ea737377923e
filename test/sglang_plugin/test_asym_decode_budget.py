"""asym-decode's rows per step (asym_decode.step_budget): the configured budget, raised to every running
request's decode row and one window; with deterministic inference also to a whole window chunk beside
max_running - 1 decode rows, so the budget policy's deterministic config can always admit the head's chunk."""

import pytest

from sglang_asym.sched import SchedulerConfig
from sglang_asym.sglang_plugin.decode.window_step import step_budget
from sglang_asym.sglang_plugin.shared.settings import AsymSettings

SETTINGS = AsymSettings("asym-decode", window=128, token_budget=256, window_chunk=32)


def test_the_configured_budget_when_it_leaves_room():
    assert step_budget(SETTINGS, 8, deterministic=False) == 256
    assert step_budget(SETTINGS, 8, deterministic=True) == 256  # 256 - 7 >= 32


def test_at_least_every_running_request_and_one_window():
    assert step_budget(SETTINGS, 300, deterministic=False) == 300
    assert step_budget(AsymSettings("asym-decode", window=128, token_budget=16), 4, deterministic=False) == 128


def test_deterministic_leaves_a_whole_chunk_beside_the_running_requests():
    assert step_budget(SETTINGS, 300, deterministic=True) == 299 + 32
    assert step_budget(SETTINGS, 226, deterministic=True) == 257  # 256 would leave 31 rows
    assert step_budget(SETTINGS, 225, deterministic=True) == 256
    whole = AsymSettings("asym-decode", window=128, token_budget=256, window_chunk=0)  # whole windows
    assert whole.chunk_rows is None and step_budget(whole, 300, deterministic=True) == 300


def test_the_policy_accepts_every_raised_budget():
    """Without the raise the deterministic SchedulerConfig refuses the budget (test of the reason for it)."""
    for max_running in (1, 8, 225, 226, 300, 1000):
        budget = step_budget(SETTINGS, max_running, deterministic=True)
        SchedulerConfig(token_budget=budget, max_window_rows_per_step=budget, max_running=max_running,
                        num_draft_tokens=0, window=128, window_chunk=32, deterministic=True)
    with pytest.raises(ValueError, match=r"= 1 >= window_chunk \(32\)"):
        SchedulerConfig(token_budget=300, max_window_rows_per_step=300, max_running=300, num_draft_tokens=0,
                        window=128, window_chunk=32, deterministic=True)
