"""Planner report: asym vs symmetric vs colocated vs the RFC #57738 split on B300 and GB200 NVL72 for the presets.

For each GPU, workload preset and mode: the plan (`sglang_asym.plan.planner.plan`: replicas per pool from the
roofline step-time model, memory fit, transfer, serving unit) and a simulated slice of one serving unit driving
the real scheduler (goodput per GPU, TTFT / ITL p50 and p99). Then, on one D rank of each GPU's asym plan, an
admission burst with and without the budget policy (the ITL p99 cost of window steps and the TTFT price), the
public figures the planner must reproduce, and a sensitivity run at half the assumed efficiencies.
Writes benchmark/results/plan_report.{json,md,png}.

    nice -n 10 .venv/bin/python benchmark/plan_report.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sglang_asym.plan.gpu_model import Efficiency, GpuStepModel
from sglang_asym.plan.gpus import gpu
from sglang_asym.plan.layout import LayoutError, ServingUnit, dry_run
from sglang_asym.plan.planner import PlanOptions, plan, sched_config
from sglang_asym.plan.share import prefill_share
from sglang_asym.plan.sim import ClusterConfig, Simulator, SimRequest, Slo
from sglang_asym.plan.steptime import Role
from sglang_asym.plan.transfer_model import Mode
from sglang_asym.plan.workload import preset

RESULTS = Path(__file__).resolve().parent / "results"
GPUS = ("B300", "GB200-NVL72")
PRESETS = {"chat": 400.0, "summarization": 100.0, "reasoning": 40.0, "deepseek": 200.0}  # req/s
SIM_REQUESTS = {"chat": 400, "summarization": 400, "reasoning": 150, "deepseek": 300}
MODES = (Mode.COLOCATED, Mode.SYMMETRIC, Mode.ASYM, Mode.RFC57738)
SLO = Slo(1.5, 0.060)  # the operators' alarms: ttft-p99 1500 ms, itl-p99 60 ms


def plans(quick: bool) -> list[dict]:
    rows = []
    cases = [(g, w, m) for g in GPUS for w in PRESETS for m in MODES]
    if quick:
        cases = [c for c in cases if c[1] == "chat"]
    for g, w, m in tqdm(cases, desc="plans", unit="plan"):
        n = SIM_REQUESTS[w] // (4 if quick else 1)
        try:
            p = plan(preset(w), PRESETS[w], SLO, gpu(g), m, PlanOptions(), simulate_unit=True, sim_requests=n)
        except LayoutError as exc:
            rows.append({"gpu": g, "workload": w, "mode": m.value, "error": str(exc)})
            continue
        s = p["simulation"]
        rows.append({
            "gpu": g, "workload": w, "mode": m.value, "rate_rps": PRESETS[w],
            "prefill_gpus": p["prefill_gpus"], "decode_gpus": p["decode_gpus"], "total_gpus": p["total_gpus"],
            "domains": p["domains"], "gpus_in_domains": p["gpus_in_domains"],
            "unit": p["serving_unit"]["serving_unit"], "units": p["units"],
            "p_replica_gpus": p["prefill"]["gpus_per_replica"] if p["prefill"] else None,
            "d_replica_gpus": p["decode"]["gpus_per_replica"], "d_batch_per_rank": p["decode"]["batch_per_rank"],
            "d_step_ms": p["decode"]["step_ms"], "prefill_tokens_s_per_gpu": p["throughput_per_gpu"]["prefill_tokens_s"],
            "decode_tokens_s_per_gpu": p["throughput_per_gpu"]["decode_tokens_s"],
            "transfer_bytes_mean_prompt": p["transfer"]["bytes_mean_prompt"],
            "transfer_ms_mean_prompt": 1000 * p["transfer"]["seconds_mean_prompt"],
            "ttft_break_even_vs_symmetric_tokens": p["transfer"]["ttft_break_even_vs_symmetric_tokens"],
            "planned_ttft_p99_ms": p["ttft_estimate_ms"]["p99_at_plan_load"],
            "sim": {k: s[k] for k in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "slo_attainment",
                                      "goodput_rps_per_gpu", "prefill_busy", "decode_busy", "decode_queue_max",
                                      "prefill_queue_max", "slice")},
        })
    by = {(r["gpu"], r["workload"], r["mode"]): r for r in rows}
    for r in rows:
        sym = by.get((r["gpu"], r["workload"], "symmetric"))
        if r["mode"] in ("asym", "rfc57738") and "error" not in r and sym and "error" not in sym:
            r["prefill_gpus_saved_vs_symmetric"] = sym["prefill_gpus"] - r["prefill_gpus"]
    return rows


def burst(g: str, policy: str, running: int, new: int, context: int) -> dict:
    """One D rank of the asym chat plan's replica: `running` requests decode, then `new` windows arrive at once."""
    spec = gpu(g)
    chat = plan(preset("chat"), PRESETS["chat"], SLO, spec, Mode.ASYM, PlanOptions())
    d_gpus = chat["decode"]["gpus_per_replica"]
    options = PlanOptions(policy=policy, window_chunk=32 if policy == "budget" else None)
    sched = sched_config(running + new, options)
    model = GpuStepModel(spec, d_gpus, Role.FULL)
    cfg = ClusterConfig(Mode.ASYM, model, sched, prefill_model=model)
    runs = [SimRequest(f"run{i}", 0.0, context, 100_000, prefix_ready=True) for i in range(running)]
    # every window admitted (budget: 128 / 32 chunk steps each) well within 20 simulated seconds
    first = Simulator(cfg, record_token_times=True).run(runs, SLO, until_s=20.0)
    all_running = max(first.token_times[r.rid][0] for r in runs)
    burst_at = all_running + 40 * chat["decode"]["step_ms"] / 1000
    news = [SimRequest(f"new{j}", burst_at, context, 2, prefix_ready=True) for j in range(new)]
    res = Simulator(cfg, record_token_times=True).run(runs + news, SLO, stop_after=[n.rid for n in news],
                                                      until_s=burst_at + 600.0)
    end = max(res.first_token_s[n.rid] for n in news)
    steady, during = [], []
    for r in runs:
        ts = res.token_times[r.rid]
        for a, b in zip(ts, ts[1:]):
            if a >= all_running and b <= burst_at:
                steady.append(b - a)
            elif b > burst_at and a < end:
                during.append(b - a)
    ttft = [res.first_token_s[n.rid] - burst_at for n in news]
    return {"gpu": g, "policy": policy, "d_replica_gpus": d_gpus, "running": running, "burst": new, "context": context,
            "steady_itl_p99_ms": 1000 * float(np.percentile(steady, 99)),
            "burst_itl_p99_ms": 1000 * float(np.percentile(during, 99)),
            "burst_over_steady": float(np.percentile(during, 99) / np.percentile(steady, 99)),
            "burst_ttft_mean_ms": 1000 * float(np.mean(ttft)), "burst_ttft_max_ms": 1000 * float(np.max(ttft))}


def public_checks() -> dict:
    rp, rd = 12_000, 800
    shares = {name: prefill_share(r, 1, rp, rd) for name, r in
              (("chat r=4", 4), ("summarization r=20", 20), ("reasoning r=1/6", 1 / 6), ("deepseek r=3.62", 608 / 168))}
    refusal = None
    try:
        dry_run(ServingUnit(4, 2, 64, 1), 8, "same-domain", "prod-us", "h200-use1")
    except LayoutError as exc:
        refusal = f"error  {exc}"
    nvl72 = dry_run(ServingUnit(4, 2, 64, 1), 72).as_dict()
    # the planner itself, given DeepInfer's replica sizes: which unit does it build on an NVL72?
    planned = plan(preset("deepseek"), 100.0, SLO, gpu("GB200-NVL72"), Mode.ASYM,
                   PlanOptions(decode_gpus=64, prefill_gpus=4))["serving_unit"]["serving_unit"]
    return {"shares_at_rp_12000_rd_800": shares, "deepseek_disclosed_32_of_176": 32 / 176,
            "deepinfer_unit_on_nvl72": nvl72, "planner_unit_with_deepinfer_replica_sizes": planned,
            "h200_domain_refusal": refusal}


def sensitivity() -> list[dict]:
    out = []
    for label, eff in (("assumed (MBU 0.7, MFU 0.45)", Efficiency()),
                       ("half (MBU 0.35, MFU 0.225)", Efficiency(mbu=0.35, mfu=0.225))):
        for m in (Mode.SYMMETRIC, Mode.ASYM):
            p = plan(preset("chat"), PRESETS["chat"], SLO, gpu("GB200-NVL72"), m, PlanOptions(efficiency=eff))
            out.append({"efficiency": label, "mode": m.value, "prefill_gpus": p["prefill_gpus"],
                        "decode_gpus": p["decode_gpus"], "total_gpus": p["total_gpus"],
                        "d_step_ms": p["decode"]["step_ms"]})
    return out


def model_rates() -> list[dict]:
    rows = []
    for g in GPUS:
        spec = gpu(g)
        d = GpuStepModel(spec, 16)
        rows.append({"gpu": g, "decode_tokens_s_per_gpu_b128_ctx4k": d.decode_tokens_per_gpu_s(128, 4096),
                     "prefill_tokens_s_per_gpu_full": GpuStepModel(spec, 2, Role.FULL).prefill_tokens_per_gpu_s(Role.FULL),
                     "prefill_tokens_s_per_gpu_asym_p": GpuStepModel(spec, 1, Role.ASYM_P).prefill_tokens_per_gpu_s(
                         Role.ASYM_P)})
    return rows


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["plans"] if "error" not in r]
    fig, axes = plt.subplots(2, 3, figsize=(19, 9))
    for gi, g in enumerate(GPUS):
        ax_gpus, ax_good = axes[gi][0], axes[gi][1]
        labels, p_gpus, d_gpus, good = [], [], [], []
        for w in PRESETS:
            for m in MODES:
                r = next((x for x in rows if x["gpu"] == g and x["workload"] == w and x["mode"] == m.value), None)
                labels.append(f"{w[:5]}\n{m.value[:4]}")
                p_gpus.append(r["prefill_gpus"] if r else 0)
                d_gpus.append(r["decode_gpus"] if r else 0)
                good.append(r["sim"]["goodput_rps_per_gpu"] if r else 0)
        x = np.arange(len(labels))
        ax_gpus.bar(x, p_gpus, color="C1", label="P GPUs")
        ax_gpus.bar(x, d_gpus, bottom=p_gpus, color="C0", label="D GPUs")
        ax_gpus.set_xticks(x, labels, fontsize=6)
        ax_gpus.set_title(f"{g}: GPUs planned (rates {', '.join(f'{k} {v:g}' for k, v in PRESETS.items())} req/s)",
                          fontsize=8)
        ax_gpus.legend(fontsize=7)
        ax_good.bar(x, good, color=["C2" if "asym" in lbl else "C7" for lbl in labels])
        ax_good.set_xticks(x, labels, fontsize=6)
        ax_good.set_title(f"{g}: simulated goodput per GPU (req/s meeting TTFT 1.5 s and ITL 60 ms)", fontsize=8)
        b = [r for r in report["burst"] if r["gpu"] == g]
        ax = axes[gi][2]
        names = [r["policy"] for r in b]
        ax.bar(np.arange(len(b)) - 0.2, [r["burst_over_steady"] for r in b], 0.4, label="burst / steady ITL p99")
        ax2 = ax.twinx()
        ax2.bar(np.arange(len(b)) + 0.2, [r["burst_ttft_mean_ms"] for r in b], 0.4, color="C3", label="burst TTFT mean (ms)")
        ax.set_xticks(np.arange(len(b)), names)
        ax.set_title(f"{g}: admission burst on one D rank ({b[0]['running']} running, {b[0]['burst']} windows)",
                     fontsize=8)
        ax.legend(loc="upper left", fontsize=7)
        ax2.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def markdown(report: dict) -> str:
    lines = ["# Sizing asymmetric PD for DeepSeek-V4.1-Flash: planner report", "",
             f"Command: `{report['command']}`. SLOs: TTFT p99 {SLO.ttft_s * 1000:.0f} ms, ITL p99 {SLO.itl_s * 1000:.0f} ms. "
             "Step times from the roofline model (docs/planning.md; MBU 0.7 / MFU 0.45 are assumptions, not "
             "calibrations); simulated columns are a slice of one serving unit driving the real scheduler.", "",
             "## Plans and simulated slices", "",
             "| GPU | workload | mode | P GPUs | D GPUs | total (in domains) | unit | P saved vs sym | goodput/GPU | TTFT p50/p99 ms | ITL p50/p99 ms | SLO met |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["plans"]:
        if "error" in r:
            lines.append(f"| {r['gpu']} | {r['workload']} | {r['mode']} | refused: {r['error']} |||||||||")
            continue
        s = r["sim"]
        u = r["unit"]
        lines.append(
            f"| {r['gpu']} | {r['workload']} | {r['mode']} | {r['prefill_gpus']} | {r['decode_gpus']} | "
            f"{r['total_gpus']} ({r['gpus_in_domains']}) | "
            f"{u['prefill']} + {u['decode']} | {r.get('prefill_gpus_saved_vs_symmetric', '')} | "
            f"{s['goodput_rps_per_gpu']:.2f} | {1000 * s['ttft_p50_s']:.0f} / {1000 * s['ttft_p99_s']:.0f} | "
            f"{1000 * s['itl_p50_s']:.1f} / {1000 * s['itl_p99_s']:.1f} | {100 * s['slo_attainment']:.0f}% |")
    lines += ["", "## Admission bursts on one D rank: window steps' ITL p99 cost, with and without the budget policy", "",
              "| GPU | policy | D replica GPUs | running | burst | steady ITL p99 ms | burst ITL p99 ms | ratio | burst TTFT mean / max ms |",
              "|---|---|---|---|---|---|---|---|---|"]
    for b in report["burst"]:
        lines.append(f"| {b['gpu']} | {b['policy']} | {b['d_replica_gpus']} | {b['running']} | {b['burst']} | "
                     f"{b['steady_itl_p99_ms']:.1f} | {b['burst_itl_p99_ms']:.1f} | {b['burst_over_steady']:.2f} | "
                     f"{b['burst_ttft_mean_ms']:.0f} / {b['burst_ttft_max_ms']:.0f} |")
    pc = report["public_checks"]
    lines += ["", "## Public figures", ""]
    for k, v in pc["shares_at_rp_12000_rd_800"].items():
        lines.append(f"- prefill share, {k}: {100 * v:.1f}%")
    lines += [f"- DeepSeek's 32 P : 144 D GPUs: {100 * pc['deepseek_disclosed_32_of_176']:.1f}%",
              f"- DeepInfer's 2 x 4 P + 64 D unit on GB200 NVL72: {pc['deepinfer_unit_on_nvl72']['serving_unit']['gpus']} GPUs, "
              f"{pc['deepinfer_unit_on_nvl72']['units_per_domain']} unit per 72-GPU domain",
              f"- the planner given DeepInfer's replica sizes (4-GPU P, 64-GPU D), DeepSeek's mix at 100 req/s on GB200 "
              f"NVL72: {pc['planner_unit_with_deepinfer_replica_sizes']['prefill']} + "
              f"{pc['planner_unit_with_deepinfer_replica_sizes']['decode']} = "
              f"{pc['planner_unit_with_deepinfer_replica_sizes']['gpus']} GPUs",
              f"- the same unit on an 8-GPU H200 domain: `{pc['h200_domain_refusal']}`", "",
              "## The model's own rates per GPU", "",
              "| GPU | decode tok/s/GPU (16-GPU D, batch 128/rank, ctx 4k) | prefill tok/s/GPU full (2 GPUs) | asym P (1 GPU) |",
              "|---|---|---|---|"]
    for r in report["model_rates"]:
        lines.append(f"| {r['gpu']} | {r['decode_tokens_s_per_gpu_b128_ctx4k']:.0f} | {r['prefill_tokens_s_per_gpu_full']:.0f} | "
                     f"{r['prefill_tokens_s_per_gpu_asym_p']:.0f} |")
    lines += ["", "## Sensitivity: chat on GB200 NVL72 at half the assumed efficiencies", "",
              "| efficiency | mode | P GPUs | D GPUs | total | D step ms |", "|---|---|---|---|---|---|"]
    for r in report["sensitivity"]:
        lines.append(f"| {r['efficiency']} | {r['mode']} | {r['prefill_gpus']} | {r['decode_gpus']} | {r['total_gpus']} | "
                     f"{r['d_step_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="chat only, a quarter of the simulated requests")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    report = {"command": "python " + " ".join(sys.argv), "slo": {"ttft_s": SLO.ttft_s, "itl_s": SLO.itl_s},
              "rates_rps": PRESETS, "plans": plans(args.quick),
              "burst": [burst(g, policy, 96, 32, 2500) for g in GPUS for policy in ("budget", "admit_all")],
              "public_checks": public_checks(), "model_rates": model_rates(), "sensitivity": sensitivity()}
    report["wall_s"] = round(time.perf_counter() - started, 1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "plan_report.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out_dir / "plan_report.md").write_text(markdown(report))
    plot(report, args.out_dir / "plan_report.png")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
