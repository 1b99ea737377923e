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
from sglang_asym.plan.cpu_model import CpuStepModel
from sglang_asym.plan.sim import ClusterConfig, Simulator, SimRequest, Slo
from sglang_asym.plan.transfer_model import Link, Mode
from sglang_asym.sched import SchedulerConfig

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 0.25
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
                            max_running=running + burst, num_draft_tokens=0, window=128, mode="mixed", policy=policy,
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
def serving_requests(settings: dict) -> list[list[SimRequest]]:
    """The sweep's prompt lengths and Poisson send offsets, drawn exactly as benchmark/serving.py draws them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from serving import poisson_arrivals  # noqa: PLC0415 (the benchmark's own function)

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


def serving_cluster(mode: str, model: CpuStepModel, link: Link) -> ClusterConfig:
    # launch_server defaults: --decode-token-budget 256, --max-running-requests 8, --window-chunk-size 32,
    # --chunked-prefill-size 1024; one prefill at a time (one compute thread)
    sched = SchedulerConfig(token_budget=256, max_window_rows_per_step=256, max_running=8, num_draft_tokens=0,
                            window=128, window_chunk=32)
    common = dict(prefill_chunk=1024, pack_prefill=False, link=link, model_cfg=V41Config.small())
    if mode == "colocated":  # `null`: the prefix on its own thread beside the decode loop, then the window step
        return ClusterConfig(Mode.COLOCATED, model, sched, colocated_prefill_in_step=False, colocated_split=True,
                             **common)
    return ClusterConfig(Mode(mode), model, sched, prefill_model=model, **common)


def validate_serving(model: CpuStepModel, link: Link, speeds: dict | None = None) -> list[dict]:
    """Rows of the serving sweep; `speeds` (if given) receives each mode's prefill speed factor."""
    measured = json.loads((RESULTS / "serving.json").read_text())
    sweeps = serving_requests(measured["settings"])
    rows = []
    for mode, entry in measured["modes"].items():
        factor = prefill_speed(mode, model, link, entry, sweeps)
        if speeds is not None:
            speeds[mode] = factor
        mode_model = scaled_prefill(model, factor)
        for rate_entry, requests in zip(entry["rates"], sweeps):
            sim = _serving_metrics(Simulator(serving_cluster(mode, mode_model, link)).run(requests, SLO))
            unscaled = _serving_metrics(Simulator(serving_cluster(mode, model, link)).run(requests, SLO))
            real = {"ttft_p50_ms": rate_entry["ttft"]["p50_ms"], "ttft_p99_ms": rate_entry["ttft"]["p99_ms"],
                    "itl_p50_ms": rate_entry["itl"]["p50_ms"], "itl_p99_ms": rate_entry["itl"]["p99_ms"]}
            for metric in sim:
                row = _row("serving", f"{mode} @ {rate_entry['rate_rps']} req/s", metric, sim[metric], real[metric])
                row["simulated_unscaled_prefill"] = round(unscaled[metric], 3)
                row["relative_error_unscaled_prefill"] = round(unscaled[metric] / real[metric] - 1, 4)
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


def markdown(rows: list[dict], model: CpuStepModel, link: Link, speeds: dict) -> str:
    met = sum(r["within_target"] for r in rows)
    factors = ", ".join(f"{mode} {k:.3f}" for mode, k in speeds.items())
    lines = ["# Simulator vs the project's CPU benchmarks", "",
             "Command: `python benchmark/plan_validate.py` (after `python benchmark/plan_cpu_steptime.py --refit`).", "",
             f"Step times: `CpuStepModel` fitted in benchmark/results/plan_cpu_steptime.json (decode steps on the "
             f"decode loop's step log, prefill on one-shot prefills); link {link.name} "
             f"{link.bytes_per_s / 1e9:.3f} GB/s + {link.latency_s * 1000:.2f} ms. Serving prefill times scaled per "
             f"mode by the prefill compute the sweep's servers reported over the fit's ({factors}). "
             f"Target: within {TARGET:.0%}. **{met} of {len(rows)} metrics within target.**", "",
             "decode_itl's step costs are fitted on the same run's step log, so its rows test the simulator (which rows "
             "the real scheduler puts in which step, and the ITL / TTFT accounting over them), not the step model out "
             "of sample; the serving sweep is another run. The last column is the serving rows' error with the "
             "grid's prefill fit unscaled. Why the rows outside the target miss: docs/planning.md, Validation.", "",
             "| benchmark | case | metric | simulated | measured | error | within 25% | error, prefill unscaled |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        unscaled = r.get("relative_error_unscaled_prefill")
        lines.append(f"| {r['benchmark']} | {r['case']} | {r['metric']} | {_num(r['simulated'])} | {_num(r['measured'])} | "
                     f"{100 * r['relative_error']:+.0f}% | {'yes' if r['within_target'] else 'no'} | "
                     f"{'' if unscaled is None else f'{100 * unscaled:+.0f}%'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    model = CpuStepModel.from_json(RESULTS / "plan_cpu_steptime.json")
    link = loopback_link(json.loads((RESULTS / "transfer.json").read_text()))
    speeds: dict = {}
    rows = validate_decode_itl(model) + validate_serving(model, link, speeds)
    out = {"command": "python " + " ".join(sys.argv), "target_relative_error": TARGET,
           "cpu_model": {k: v for k, v in vars(model).items()}, "serving_prefill_speed": speeds,
           "link": {"name": link.name, "bytes_per_s": link.bytes_per_s, "latency_s": link.latency_s},
           "within_target": sum(r["within_target"] for r in rows), "metrics": len(rows), "rows": rows}
    (RESULTS / "plan_validation.json").write_text(json.dumps(out, indent=1, default=str))
    (RESULTS / "plan_validation.md").write_text(markdown(rows, model, link, speeds))
    print(markdown(rows, model, link, speeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
