"""Validate the simulator against this project's CPU benchmarks, with the CPU step-time model measured here.

Replays the exact scenarios of benchmark/decode_itl.py (16 running requests, a burst of 8 windows, budget
policy with 8-row chunks vs admit-all) and benchmark/serving.py (4 requests per rate at 0.2 and 1 req/s,
prompts 512-1024 from the same seeded draws, 8 output tokens, colocated / symmetric / asym with the servers'
scheduler settings) through `sglang_asym.plan.sim` driving the real scheduler, with
`CpuStepModel.from_json(benchmark/results/plan_cpu_steptime.json)` for step times and a loopback link fitted
from benchmark/results/transfer.json. Compares each metric with the measured one (relative error; target 25%)
and writes benchmark/results/plan_validation.json and .md.

The shared cores do not run at one speed from one hour to the next, and the serving sweep ran on another
occasion than the prefill timings: each serving mode's prefill times are scaled by the prefill compute its
servers reported in that run (serving.json's prefill_compute_s_per_request, both rates pooled) over what the
fit predicts for the same prompts. That factor comes from a record the sweep made beside its latencies, never
from the latencies the table compares; it is in the output.

Prefill beside decode on the same machine: the CPU servers share two cores, so a decode step that starts while a
prefill runs waits longer (`ClusterConfig.colocated_step_delay_s`: the colocated server's prefix thread in the decode
loop's own process; `cohosted_step_delay_s`: a P server's prefill in another process; in proportion to the part of the
step the prefill keeps running). Both delays are fitted on an
earlier sweep with the same settings (benchmark/results/plan_serving_calibration.json, whose servers ran whole
128-row window steps), each by least squares of the relative errors of the ITL p50 and p99 of the modes it acts on,
and then held fixed for the sweep the table compares: an out-of-sample test.

    .venv/bin/python benchmark/plan_validate.py
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path

import numpy as np

from sglang_asym.config import V41Config
from sglang_asym.plan.sim import ClusterConfig, Simulator, SimRequest, Slo
from sglang_asym.plan.transfer_model import Link, Mode
from sglang_asym.sched import SchedulerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))  # the harness: the CPU step-time model
from harness.cpu_step_model import CpuStepModel  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CALIBRATION = RESULTS / "plan_serving_calibration.json"
TARGET = 0.25
DELAY_MAX_MS = 200  # step delays searched: 0-200 ms, every 5 ms, then every 1 ms around the best
SERVING_CHUNK = 32  # the servers' --window-chunk-size default since commit 75ebd0d
SLO = Slo(1e6, 1e6)  # the CPU benchmarks have no SLO: goodput is not compared


def nearest_rank(values: list[float], q: float) -> float:
    """decode_itl.py's percentile (nearest rank)."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def loopback_link(transfer: dict) -> Link:
    """Latency and bandwidth of the staged layer over loopback (incl. D's handshake), least squares over N."""
    per_n = transfer["per_n"].values()
    x = np.array([v["asym_payload_bytes"] for v in per_n], dtype=float)
    y = np.array([v["layer_incl_handshake_seconds_median"] for v in per_n], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    return Link("loopback-tcp", 1 / slope, max(float(intercept), 0.0))


# ---- decode_itl.py -----------------------------------------------------------------------------------------
def decode_itl_policy(model: CpuStepModel, measured: dict, policy: str) -> dict:
    running, burst, chunk, steady_steps = measured["running"], measured["burst"], 8, 32
    run_cfg = next(p for p in measured["policies"] if p["policy"] == policy)
    sched = SchedulerConfig(token_budget=running + (chunk if policy == "budget" else 128), max_window_rows_per_step=128,
                            max_running=running + burst, num_draft_tokens=0, window=128, policy=policy,
                            window_chunk=chunk if policy == "budget" else None)
    assert sched.token_budget == run_cfg["token_budget"]
    cfg = ClusterConfig(Mode.ASYM, model, sched, prefill_model=model, model_cfg=V41Config.small())
    prompt = measured["prompt_len"]
    runs = [SimRequest(f"run{i}", 0.0, prompt, 4000, prefix_ready=True) for i in range(running)]
    # pass 1: when has every running request decoded steady_steps tokens since the last one started?
    first = Simulator(cfg, record_token_times=True).run(runs, SLO, until_s=3600.0)
    all_running_at = max(first.token_times[r.rid][0] for r in runs)
    start_counts = {r.rid: sum(1 for t in first.token_times[r.rid] if t <= all_running_at) for r in runs}
    burst_at = max(first.token_times[r.rid][start_counts[r.rid] + steady_steps - 1] for r in runs)
    news = [SimRequest(f"new{j}", burst_at, prompt, 2, prefix_ready=True) for j in range(burst)]
    second = Simulator(cfg, record_token_times=True).run(runs + news, SLO, until_s=burst_at + 3600.0,
                                                          stop_after=[n.rid for n in news])
    admissions_end = max(second.first_token_s[n.rid] for n in news)
    steady, during = [], []
    for r in runs:
        ts = second.token_times[r.rid]
        for a, b in zip(ts, ts[1:]):
            if a < all_running_at:
                continue
            if b <= burst_at:
                steady.append(b - a)
            elif a < admissions_end:
                during.append(b - a)
    ttft = [second.first_token_s[n.rid] - burst_at for n in news]
    return {"steady_p99_ms": 1000 * nearest_rank(steady, 99), "burst_p99_ms": 1000 * nearest_rank(during, 99),
            "ratio": nearest_rank(during, 99) / nearest_rank(steady, 99), "ttft_mean_ms": 1000 * float(np.mean(ttft)),
            "steady_intervals": len(steady), "burst_intervals": len(during)}


def validate_decode_itl(model: CpuStepModel) -> list[dict]:
    measured = json.loads((RESULTS / "decode_itl.json").read_text())
    rows = []
    for policy in ("budget", "admit_all"):
        sim = decode_itl_policy(model, measured, policy)
        m = next(p for p in measured["policies"] if p["policy"] == policy)
        pairs = {"burst_p99_over_steady_p99": (sim["ratio"], m["burst_p99_ms"] / m["steady_p99_ms"]),
                 "steady_p99_ms": (sim["steady_p99_ms"], m["steady_p99_ms"]),
                 "burst_p99_ms": (sim["burst_p99_ms"], m["burst_p99_ms"]),
                 "burst_ttft_mean_ms": (sim["ttft_mean_ms"], m["ttft_mean_ms"])}
        for metric, (s, v) in pairs.items():
            rows.append(_row("decode_itl", f"{policy}", metric, s, v))
    return rows


# ---- serving.py ----------------------------------------------------------------------------------------------
def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    """Send offsets (s) of n requests arriving as a Poisson process of `rate` per second, drawn as the retired
    serving benchmark drew them (its measurements stay in benchmark/results/serving.json)."""
    if rate <= 0 or n < 0:
        raise ValueError(f"rate must be > 0 and n >= 0, got {rate}, {n}")
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def serving_requests(settings: dict) -> list[list[SimRequest]]:
    """The sweep's prompt lengths and Poisson send offsets, drawn exactly as the serving benchmark drew them."""
    rates = [float(r) for r in settings["rates"].split(",")]
    rng = random.Random(settings["seed"])
    lengths = [[rng.randint(settings["prompt_min"], settings["prompt_max"]) for _ in range(settings["requests_per_rate"])]
               for _ in rates]
    out = []
    for r, rate in enumerate(rates):
        offsets = poisson_arrivals(rate, settings["requests_per_rate"], settings["seed"] * 10 + r)
        out.append([SimRequest(f"r{i}", offsets[i], lengths[r][i], settings["max_new_tokens"])
                    for i in range(len(offsets))])
    return out


def prefill_speed(mode: str, model: CpuStepModel, link: Link, entry: dict, sweeps: list[list[SimRequest]]) -> float:
    """The mode's reported prefill compute per request in the sweep over the model's, same prompts, same chunks."""
    cfg = serving_cluster(mode, model, link)
    role = cfg.prefill_role
    predicted, reported, count = 0.0, 0.0, 0
    for rate_entry, requests in zip(entry["rates"], sweeps):
        for req in requests:
            tokens = cfg.prefill_tokens(req.prompt_tokens)
            predicted += sum(model.prefill_s(min(cfg.prefill_chunk, tokens - at), role, at)
                             for at in range(0, tokens, cfg.prefill_chunk))
        reported += rate_entry["prefill_compute_s_per_request"] * len(requests)
        count += len(requests)
    return reported / predicted


def scaled_prefill(model: CpuStepModel, factor: float) -> CpuStepModel:
    return dataclasses.replace(model, prefill_p=tuple(factor * c for c in model.prefill_p),
                               prefill_full=tuple(factor * c for c in model.prefill_full))


@dataclasses.dataclass(frozen=True)
class StepDelays:
    """Decode-step delays beside a running prefill (seconds): the colocated prefix thread's, a P process's."""

    colocated_s: float = 0.0
    cohosted_s: float = 0.0


def serving_cluster(mode: str, model: CpuStepModel, link: Link, window_chunk: int = SERVING_CHUNK,
                    delays: StepDelays = StepDelays()) -> ClusterConfig:
    # launch_server defaults: --decode-token-budget 256, --max-running-requests 8, --window-chunk-size 32 (128, the
    # whole window, before commit 75ebd0d), --chunked-prefill-size 1024; one prefill at a time (one compute thread)
    sched = SchedulerConfig(token_budget=256, max_window_rows_per_step=256, max_running=8, num_draft_tokens=0,
                            window=128, window_chunk=window_chunk)
    common = dict(prefill_chunk=1024, pack_prefill=False, link=link, model_cfg=V41Config.small())
    if mode == "colocated":  # `null`: the prefix on its own thread beside the decode loop, then the window step
        return ClusterConfig(Mode.COLOCATED, model, sched, colocated_prefill_in_step=False, colocated_split=True,
                             colocated_step_delay_s=delays.colocated_s, **common)
    # the CPU servers' symmetric P ran every layer on every row: the labelled full-compute baseline
    pd_mode = Mode.SYMMETRIC_FULL if mode == "symmetric" else Mode(mode)
    return ClusterConfig(pd_mode, model, sched, prefill_model=model, cohosted_step_delay_s=delays.cohosted_s,
                         **common)


def replay_sweep(sweep: dict, model: CpuStepModel, link: Link, window_chunk: int, delays: StepDelays,
                 modes: tuple[str, ...] | None = None) -> dict:
    """{(mode, rate): simulated metrics} of a serving sweep, each mode's prefill scaled to what its servers reported."""
    requests = serving_requests(sweep["settings"])
    out = {}
    for mode, entry in sweep["modes"].items():
        if modes is not None and mode not in modes:
            continue
        mode_model = scaled_prefill(model, prefill_speed(mode, model, link, entry, requests))
        for rate_entry, reqs in zip(entry["rates"], requests):
            cfg = serving_cluster(mode, mode_model, link, window_chunk, delays)
            out[(mode, rate_entry["rate_rps"])] = _serving_metrics(Simulator(cfg).run(reqs, SLO))
    return out


def measured_serving(rate_entry: dict) -> dict:
    return {"ttft_p50_ms": rate_entry["ttft"]["p50_ms"], "ttft_p99_ms": rate_entry["ttft"]["p99_ms"],
            "itl_p50_ms": rate_entry["itl"]["p50_ms"], "itl_p99_ms": rate_entry["itl"]["p99_ms"]}


def grid_min(loss) -> float:
    """The delay (s, whole ms) of least loss: every 5 ms over 0..DELAY_MAX_MS, then every 1 ms within 4 ms of the best."""
    coarse = min(range(0, DELAY_MAX_MS + 1, 5), key=lambda ms: loss(ms / 1000))
    fine = min(range(max(coarse - 4, 0), min(coarse + 4, DELAY_MAX_MS) + 1), key=lambda ms: loss(ms / 1000))
    return fine / 1000


def fit_step_delays(model: CpuStepModel, link: Link, calibration: dict) -> tuple[StepDelays, dict]:
    """Each delay: the grid value minimising the squared relative errors of the calibration sweep's ITL p50 and p99
    over the modes it acts on (colocated's for the prefix thread; symmetric's and asym's for a P process)."""
    sweep, chunk = calibration["sweep"], calibration["window_chunk"]
    measured = {(mode, r["rate_rps"]): measured_serving(r) for mode, e in sweep["modes"].items() for r in e["rates"]}

    def loss(delays: StepDelays, modes: tuple[str, ...]) -> float:
        sim = replay_sweep(sweep, model, link, chunk, delays, modes)
        return sum((sim[key][m] / measured[key][m] - 1) ** 2 for key in sim for m in ("itl_p50_ms", "itl_p99_ms"))

    colocated = grid_min(lambda d: loss(StepDelays(colocated_s=d), ("colocated",)))
    cohosted = grid_min(lambda d: loss(StepDelays(cohosted_s=d), ("symmetric", "asym")))
    delays = StepDelays(colocated, cohosted)
    report = {"source_commit": calibration["source_commit"], "window_chunk": chunk,
              "colocated_step_delay_s": colocated, "cohosted_step_delay_s": cohosted,
              "loss_colocated": round(loss(delays, ("colocated",)), 5),
              "loss_colocated_without": round(loss(StepDelays(), ("colocated",)), 5),
              "loss_pd": round(loss(delays, ("symmetric", "asym")), 5),
              "loss_pd_without": round(loss(StepDelays(), ("symmetric", "asym")), 5)}
    return delays, report


def validate_serving(model: CpuStepModel, link: Link, delays: StepDelays, speeds: dict | None = None) -> list[dict]:
    """Rows of the serving sweep; `speeds` (if given) receives each mode's prefill speed factor. The last columns
    are each row without the prefill scaling and without the step delays."""
    measured = json.loads((RESULTS / "serving.json").read_text())
    sweeps = serving_requests(measured["settings"])
    sim = replay_sweep(measured, model, link, SERVING_CHUNK, delays)
    rows = []
    for mode, entry in measured["modes"].items():
        if speeds is not None:
            speeds[mode] = prefill_speed(mode, model, link, entry, sweeps)
        for rate_entry, requests in zip(entry["rates"], sweeps):
            unscaled = _serving_metrics(Simulator(serving_cluster(mode, model, link, delays=delays)).run(requests, SLO))
            scaled_model = scaled_prefill(model, prefill_speed(mode, model, link, entry, sweeps))
            undelayed = _serving_metrics(Simulator(serving_cluster(mode, scaled_model, link)).run(requests, SLO))
            real = measured_serving(rate_entry)
            for metric, value in sim[(mode, rate_entry["rate_rps"])].items():
                row = _row("serving", f"{mode} @ {rate_entry['rate_rps']} req/s", metric, value, real[metric])
                row["simulated_unscaled_prefill"] = round(unscaled[metric], 3)
                row["relative_error_unscaled_prefill"] = round(unscaled[metric] / real[metric] - 1, 4)
                row["simulated_without_delays"] = round(undelayed[metric], 3)
                row["relative_error_without_delays"] = round(undelayed[metric] / real[metric] - 1, 4)
                rows.append(row)
    return rows


def _serving_metrics(res) -> dict:
    ttft = [1000 * t for t in res.ttft_s]
    itl = [1000 * t for t in res.itl_s]
    return {"ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "itl_p50_ms": float(np.percentile(itl, 50)), "itl_p99_ms": float(np.percentile(itl, 99))}


def _row(benchmark: str, case: str, metric: str, simulated: float, measured: float) -> dict:
    err = simulated / measured - 1
    return {"benchmark": benchmark, "case": case, "metric": metric, "simulated": round(simulated, 3),
            "measured": round(measured, 3), "relative_error": round(err, 4), "within_target": abs(err) <= TARGET}


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def markdown(rows: list[dict], model: CpuStepModel, link: Link, speeds: dict, delay_fit: dict) -> str:
    met = sum(r["within_target"] for r in rows)
    factors = ", ".join(f"{mode} {k:.3f}" for mode, k in speeds.items())
    borderline = "; ".join(f"{r['case']} {r['metric']} {100 * r['relative_error']:+.1f}%" for r in rows
                           if TARGET - 0.01 < abs(r["relative_error"]) <= TARGET)
    lines = ["# Simulator vs the project's CPU benchmarks", "",
             "Command: `python benchmark/plan_validate.py` (after `python benchmark/plan_cpu_steptime.py --refit`).", "",
             f"Step times: `CpuStepModel` fitted in benchmark/results/plan_cpu_steptime.json (decode steps on the "
             f"decode loop's step log, prefill on one-shot prefills); link {link.name} "
             f"{link.bytes_per_s / 1e9:.3f} GB/s + {link.latency_s * 1000:.2f} ms. Serving prefill times scaled per "
             f"mode by the prefill compute the sweep's servers reported over the fit's ({factors}). "
             f"Target: within {TARGET:.0%}. **{met} of {len(rows)} metrics within target.**", "",
             "Prefill beside decode (the servers share two cores): a decode step that starts while a prefill runs on "
             "the machine takes longer, in proportion to the part of the step that prefill keeps running: "
             f"{1000 * delay_fit['colocated_step_delay_s']:.0f} ms more for a whole step when it is the colocated "
             "server's own prefix thread (one process: the decode loop's interpreter-bound work waits for the lock) and "
             f"{1000 * delay_fit['cohosted_step_delay_s']:.0f} ms more when it is a P server's prefill (another process "
             "on the same cores). Both delays are fitted on an earlier sweep with the same settings "
             f"(commit {delay_fit['source_commit']}, whole {delay_fit['window_chunk']}-row window steps; "
             "benchmark/results/plan_serving_calibration.json) on its ITL p50 and p99 (sum of squared relative errors: "
             f"colocated {delay_fit['loss_colocated_without']:.3f} without the delay, {delay_fit['loss_colocated']:.3f} "
             f"with it; symmetric and asym {delay_fit['loss_pd_without']:.3f} -> {delay_fit['loss_pd']:.3f}), then "
             "held fixed here: the serving rows are out of sample for them.", "",
             "decode_itl's step costs are fitted on the same run's step log, so its rows test the simulator (which rows "
             "the real scheduler puts in which step, and the ITL / TTFT accounting over them), not the step model out "
             "of sample; the serving sweep is another run. The last two columns are the serving rows' error with the "
             "grid's prefill fit unscaled, and without the step delays. docs/planning.md, Validation, says what each "
             "part tests and how far the p99s of this small sweep (4 TTFTs, 28 gaps per row) can be trusted.", "",
             f"Within one point of the target (borderline: a p99 of this sweep moved about 20% between two runs of "
             f"the same symmetric servers): {borderline or 'none'}.", "",
             "| benchmark | case | metric | simulated | measured | error | within 25% | error, prefill unscaled "
             "| error, no delays |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        unscaled, undelayed = r.get("relative_error_unscaled_prefill"), r.get("relative_error_without_delays")
        lines.append(f"| {r['benchmark']} | {r['case']} | {r['metric']} | {_num(r['simulated'])} | {_num(r['measured'])} | "
                     f"{100 * r['relative_error']:+.0f}% | {'yes' if r['within_target'] else 'no'} | "
                     f"{'' if unscaled is None else f'{100 * unscaled:+.0f}%'} | "
                     f"{'' if undelayed is None else f'{100 * undelayed:+.0f}%'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    model = CpuStepModel.from_json(RESULTS / "plan_cpu_steptime.json")
    link = loopback_link(json.loads((RESULTS / "transfer.json").read_text()))
    delays, delay_fit = fit_step_delays(model, link, json.loads(CALIBRATION.read_text()))
    speeds: dict = {}
    rows = validate_decode_itl(model) + validate_serving(model, link, delays, speeds)
    out = {"command": "python " + " ".join(sys.argv), "target_relative_error": TARGET,
           "cpu_model": {k: v for k, v in vars(model).items()}, "serving_prefill_speed": speeds,
           "step_delays": delay_fit,
           "link": {"name": link.name, "bytes_per_s": link.bytes_per_s, "latency_s": link.latency_s},
           "within_target": sum(r["within_target"] for r in rows), "metrics": len(rows), "rows": rows}
    text = markdown(rows, model, link, speeds, delay_fit)
    (RESULTS / "plan_validation.json").write_text(json.dumps(out, indent=1, default=str))
    (RESULTS / "plan_validation.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
