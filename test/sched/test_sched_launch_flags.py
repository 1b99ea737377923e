"""The launch CLI's --window-chunk-size: 32-row window chunks by default (each cut to the budget left), 0 for whole
windows, bad values refused."""

from __future__ import annotations

import pytest

from sglang_asym import launch_server
from sglang_asym.sched import AdmitReason, RunningRequest, WaitingRequest, plan_step


def _sched(tmp_path, *flags):
    args = launch_server.build_parser().parse_args(["--model-path", str(tmp_path), "--max-running-requests", "4",
                                                    "--decode-token-budget", "130", "--asym-window", "128", *flags])
    launch_server.validate(args)
    return launch_server.engine_options(args).scheduler


def test_default_runs_windows_in_32_row_chunks(tmp_path):
    sched = _sched(tmp_path)
    assert launch_server.DEFAULT_WINDOW_CHUNK == 32
    assert sched.window_chunk == 32 and sched.chunk_rows == 32 and sched.token_budget == 130
    running = [RunningRequest(f"r{i}", q_len=1) for i in range(3)]
    plan = plan_step(running, [WaitingRequest("w", window_rows=128, arrival_step=0)], 20, sched)
    assert [d.reason for d in plan.decisions] == [AdmitReason.CHUNK]
    assert plan.admitted[0].window_rows == 32 and plan.total_rows == 35
    assert _sched(tmp_path, "--asym-window", "16").window_chunk == 16  # never more than the window


def test_chunks_are_cut_to_the_budget_left(tmp_path):
    sched = _sched(tmp_path, "--window-chunk-size", "128")
    assert sched.window_chunk == 128 and sched.chunk_rows == 128
    running = [RunningRequest(f"r{i}", q_len=1) for i in range(3)]
    plan = plan_step(running, [WaitingRequest("w", window_rows=128, arrival_step=0)], 20, sched)
    assert [d.reason for d in plan.decisions] == [AdmitReason.CHUNK]
    assert plan.admitted[0].window_rows == 127 and plan.total_rows == 130


def test_zero_runs_whole_windows(tmp_path):
    sched = _sched(tmp_path, "--window-chunk-size", "0")
    assert sched.window_chunk is None and sched.chunk_rows == 128
    running = [RunningRequest(f"r{i}", q_len=1) for i in range(3)]
    plan = plan_step(running, [WaitingRequest("w", window_rows=128, arrival_step=0)], 20, sched)
    assert [d.reason for d in plan.decisions] == [AdmitReason.AGED]  # whole, over the budget, once aged
    assert plan.admitted[0].window_rows == 128 and plan.total_rows == 131


def test_an_explicit_chunk_size_is_kept(tmp_path):
    assert _sched(tmp_path, "--window-chunk-size", "32").window_chunk == 32


@pytest.mark.parametrize("value", ["-1", "129"])
def test_out_of_range_chunk_sizes_are_refused(tmp_path, value):
    with pytest.raises(SystemExit, match=rf"--window-chunk-size must be in \[0, --asym-window=128\] .*got {value}$"):
        _sched(tmp_path, "--window-chunk-size", value)


def test_deterministic_inference_flag(tmp_path):
    """--enable-deterministic-inference: the engine options and the scheduler both carry it; a budget too small
    for the queue head's whole chunk is refused at launch."""
    assert not _sched(tmp_path).deterministic
    args = launch_server.build_parser().parse_args(["--model-path", str(tmp_path), "--enable-deterministic-inference"])
    launch_server.validate(args)
    options = launch_server.engine_options(args)
    assert options.deterministic and options.scheduler.deterministic and options.scheduler.window_chunk == 32
    with pytest.raises(SystemExit, match=r"--enable-deterministic-inference: .* = 127 >= window_chunk \(128\)"):
        _sched(tmp_path, "--window-chunk-size", "128", "--enable-deterministic-inference")
