"""Hypothesis strategies shared by the sched tests: configs, request views and scheduler operation scripts."""

from __future__ import annotations

import os

from hypothesis import settings
from hypothesis import strategies as st

from sglang_asym.sched import RunningRequest, SchedulerConfig, WaitingRequest


# Default runs are deterministic (fixed examples, no example database written into the tree).
# SCHED_HYPOTHESIS_SCALE=N runs N times the examples with fresh random draws, for a deeper soak.
SCALE = int(os.environ.get("SCHED_HYPOTHESIS_SCALE", "1"))


def sched_settings(max_examples: int) -> settings:
    return settings(max_examples=max_examples * SCALE, deadline=None, derandomize=SCALE == 1, database=None)


@st.composite
def configs(draw, policy: str | None = None) -> SchedulerConfig:
    k = draw(st.integers(0, 7))
    max_running = draw(st.integers(1, 10))
    window = draw(st.sampled_from([1, 7, 16, 100, 128]))
    return SchedulerConfig(
        token_budget=max_running * (1 + k) + draw(st.integers(0, 3 * window)),
        max_window_rows_per_step=window + draw(st.integers(0, 2 * window)),
        max_running=max_running,
        num_draft_tokens=k,
        window=window,
        policy=policy or draw(st.sampled_from(["budget", "admit_all"])),
        max_wait_steps=draw(st.integers(0, 6)),
        max_waiting=draw(st.integers(1, 16)),
    )


@st.composite
def step_states(draw, config_strategy=None):
    """(config, running views, waiting queue oldest first, step index) consistent with each other."""
    config = draw(config_strategy if config_strategy is not None else configs())
    step = draw(st.integers(0, 30))
    n_running = draw(st.integers(0, config.max_running))
    running = [RunningRequest(f"run{i}", draw(st.integers(1, config.verify_width))) for i in range(n_running)]
    arrivals = sorted(draw(st.lists(st.integers(0, step), max_size=config.max_waiting)))
    waiting = [
        WaitingRequest(f"wait{i}", draw(st.integers(1, config.window)), arrival)
        for i, arrival in enumerate(arrivals)
    ]
    return config, running, waiting, step


def operations(config: SchedulerConfig, max_size: int = 60):
    """A script of scheduler calls: enqueue rows, step, finish the n-th running request."""
    op = st.one_of(
        st.tuples(st.just("enqueue"), st.integers(1, config.window)),
        st.tuples(st.just("step"), st.just(0)),
        st.tuples(st.just("step"), st.just(0)),
        st.tuples(st.just("finish"), st.integers(0, 20)),
    )
    return st.lists(op, max_size=max_size)
