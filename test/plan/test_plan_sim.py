"""The simulator on fixed step times: exact TTFT and ITL per mode, burst ITL with and without the budget policy
(the real scheduler decides), decode steps delayed beside a prefill on the same machine, conservation under load,
and bad input."""

from __future__ import annotations

import dataclasses

import pytest

from plan_doubles import FixedSteps
from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.sim import ClusterConfig, Simulator, SimRequest, Slo, poisson_requests, simulate
from sglang_asym.plan.transfer_model import Link, Mode
from sglang_asym.sched import SchedulerConfig

FAST = Link("test", 1e18, 0.01)  # 10 ms per request, bandwidth that costs nothing
SLO = Slo(100.0, 10.0)


def sched(running: int = 8, chunk: int | None = 32, policy: str = "budget") -> SchedulerConfig:
    budget = running + (chunk or 128)
    return SchedulerConfig(token_budget=budget, max_window_rows_per_step=max(budget, 128), max_running=running,
                           num_draft_tokens=0, policy=policy, window_chunk=chunk if policy == "budget" else None)


def cluster(mode: str, **kw) -> ClusterConfig:
    model = FixedSteps()
    base = dict(prefill_model=model, link=FAST, sched=sched())
    base.update(kw)
    return ClusterConfig(mode, model, **base)


def run_one(cfg: ClusterConfig, prompt: int = 200, output: int = 3):
    sim = Simulator(cfg, record_token_times=True)
    res = sim.run([SimRequest("a", 0.0, prompt, output)], SLO)
    return res.token_times["a"]


def test_asym_window_runs_in_chunks_on_d() -> None:
    # P computes B = 72 tokens (0.72 s), 10 ms transfer, four 32-row window chunks of 1 s, then decode steps
    assert run_one(cluster("asym")) == pytest.approx((4.73, 5.73, 6.73))


def test_asym_whole_window_is_one_step() -> None:
    assert run_one(cluster("asym", sched=sched(chunk=None)))[0] == pytest.approx(1.73)


def test_short_prompt_skips_p() -> None:
    assert run_one(cluster("asym"), prompt=100)[0] == pytest.approx(4.0)  # N <= W: straight to D, 4 chunks


def test_rfc_split_prefills_the_whole_prompt() -> None:
    assert run_one(cluster("rfc57738"))[0] == pytest.approx(2.0 + 0.01 + 4.0)


def test_symmetric_first_token_at_join() -> None:
    assert run_one(cluster("symmetric")) == pytest.approx((2.01, 3.01, 4.01))


def test_colocated_prefill_in_the_steps() -> None:
    assert run_one(cluster("colocated")) == pytest.approx((2.0, 3.0, 4.0))


def test_colocated_split_with_its_own_prefill_worker() -> None:
    cfg = cluster("colocated", colocated_prefill_in_step=False, colocated_split=True)
    assert run_one(cfg) == pytest.approx((0.72 + 4.0, 5.72, 6.72))


def test_colocated_prefix_thread_delays_the_decode_steps_it_overlaps() -> None:
    # a: prefix 72 tokens (0.72 s), four 1 s window chunks -> first token 4.72. b arrives at 4.0; its 247-token prefix
    # runs 4.0-6.47. a's step at 4.72 lies wholly beside it (+0.25 s); the one at 5.97 for half its 1 s (+0.125 s).
    # The step starting at 3.72 is not delayed: b's prefix starts during it.
    cfg = cluster("colocated", colocated_prefill_in_step=False, colocated_split=True, colocated_step_delay_s=0.25)
    res = Simulator(cfg, record_token_times=True).run([SimRequest("a", 0.0, 200, 3), SimRequest("b", 4.0, 375, 2)], SLO)
    assert res.token_times["a"] == pytest.approx((4.72, 5.97, 7.095))
    assert res.token_times["b"] == pytest.approx((11.095, 12.095))  # its window steps run beside no prefill
    undelayed = Simulator(dataclasses.replace(cfg, colocated_step_delay_s=0.0), record_token_times=True)
    assert undelayed.run([SimRequest("a", 0.0, 200, 3), SimRequest("b", 4.0, 375, 2)], SLO).token_times["a"] == \
        pytest.approx((4.72, 5.72, 6.72))


def test_cohosted_prefill_delays_d_steps() -> None:
    # symmetric: a joins D at 2.01 (2 s prefill + 10 ms); b's 1 s prefill on P runs 2.5-3.5, so a's step at 2.01
    # (b not yet arrived) is not delayed and its step at 3.01 overlaps for 0.49 of its 1 s: +0.49 * 0.2 s
    cfg = cluster("symmetric", cohosted_step_delay_s=0.2)
    res = Simulator(cfg, record_token_times=True).run([SimRequest("a", 0.0, 200, 3), SimRequest("b", 2.5, 100, 1)], SLO)
    assert res.token_times["a"] == pytest.approx((2.01, 3.01, 4.01 + 0.49 * 0.2))
    assert res.token_times["b"] == pytest.approx((4.01 + 0.49 * 0.2,))  # it reached D at 3.51 and joins at the next step


def _burst(policy: str, chunk: int | None) -> tuple[float, float]:
    """4 requests decoding, then 4 windows at once: the running requests' largest gap, and the last TTFT."""
    model = FixedSteps(step_s=1.0, per_window_row_s=0.01)
    cfg = ClusterConfig("asym", model, sched(running=8, chunk=chunk, policy=policy), prefill_model=model, link=FAST)
    reqs = [SimRequest(f"run{i}", 0.0, 128, 40, prefix_ready=True) for i in range(4)]
    reqs += [SimRequest(f"new{i}", 30.0, 128, 2, prefix_ready=True) for i in range(4)]
    res = Simulator(cfg, record_token_times=True).run(reqs, SLO)
    gaps = [b - a for i in range(4) for a, b in zip(res.token_times[f"run{i}"], res.token_times[f"run{i}"][1:])
            if a >= 30.0]
    return max(gaps), max(res.first_token_s[f"new{i}"] for i in range(4)) - 30.0


def test_budget_policy_bounds_the_burst_gap_and_pays_in_ttft() -> None:
    admit_all_gap, admit_all_ttft = _burst("admit_all", None)
    budget_gap, budget_ttft = _burst("budget", 32)
    assert admit_all_gap == pytest.approx(1 + 4 * 128 * 0.01)  # every window in one step
    # a step never exceeds the budget (8 + 32): 4 decode rows leave 36 window rows (a 32-row chunk finishing one
    # window, then 4 rows of the next)
    assert budget_gap == pytest.approx(1 + 36 * 0.01)
    assert budget_ttft > admit_all_ttft


def test_conservation_under_load() -> None:
    pairs = [(50 + 37 * i % 900, 1 + i % 9) for i in range(60)]
    reqs = poisson_requests(pairs, 4.0, seed=1)
    for mode in ("asym", "symmetric", "rfc57738", "colocated"):
        cfg = cluster(mode, prefill_replicas=2, decode_replicas=2, decode_ranks=2, sched=sched(running=4))
        sim = Simulator(cfg)
        res = sim.run(reqs, Slo(20.0, 3.0))
        assert sim.done == 60 and all(r.tokens == r.spec.output_tokens for r in sim.reqs.values())
        assert len(res.ttft_s) == 60 and min(res.ttft_s) > 0
        assert len(res.itl_s) == sum(o - 1 for _, o in pairs)
        s = res.summary
        assert 0 <= s["slo_attainment"] <= 1 and s["goodput_rps_per_gpu"] == pytest.approx(s["goodput_rps"] / s["gpus"])
        assert all(sum(len(r.scheduler.waiting) for r in d.ranks) == 0 for d in sim.decode)


def test_progress_bar_run() -> None:
    res = simulate(cluster("asym"), [SimRequest("a", 0.0, 200, 2)], SLO, progress=True)
    assert res.summary["requests"] == 1


@pytest.mark.parametrize("make, message", [
    (lambda: SimRequest("x", -1.0, 10, 1), "arrival must be a finite time >= 0"),
    (lambda: SimRequest("x", 0.0, 0, 1), "prompt and output need >= 1 token"),
    (lambda: Slo(0.0, 1.0), "ttft_s must be a finite number of seconds > 0"),
    (lambda: Slo(1.0, -0.06), "itl_s"),
    (lambda: poisson_requests([(10, 1)], -2.0, 0), "request rate must be a finite number > 0"),
    (lambda: ClusterConfig("asym", FixedSteps(), SchedulerConfig(num_draft_tokens=3), prefill_model=FixedSteps()),
     "num_draft_tokens must be 0"),
    (lambda: ClusterConfig("asym", FixedSteps(), sched()), "needs >= 1 prefill replica and a prefill model"),
    (lambda: ClusterConfig("pd", FixedSteps(), sched()), "unknown mode 'pd'"),
    (lambda: cluster("colocated", colocated_step_delay_s=-0.01), "colocated_step_delay_s must be a finite number"),
    (lambda: cluster("asym", cohosted_step_delay_s=True), "cohosted_step_delay_s must be a finite number"),
])
def test_bad_input(make, message: str) -> None:
    with pytest.raises(PlanInputError, match=message):
        make()


def test_duplicate_ids_and_empty_runs() -> None:
    with pytest.raises(PlanInputError, match="unique"):
        simulate(cluster("asym"), [SimRequest("a", 0.0, 10, 1), SimRequest("a", 1.0, 10, 1)], SLO)
    with pytest.raises(PlanInputError, match="at least one request"):
        simulate(cluster("asym"), [], SLO)
    assert Mode.parse("asym") is Mode.ASYM
