"""Asymmetric PD against SGLang's default symmetric PD (P with bounded replay) over a grid of workloads, rates,
SLOs and GPUs: for each cell both plans, the GPUs each buys, their p99 TTFT and ITL estimates, and who wins.

Each mode is planned with its P and D replicas in one scale-up domain (same-domain: KV over NVLink); where its
serving unit does not fit one domain (an 8-GPU D replica on 80 GB GPUs), with replicas placed anywhere (KV over the
scale-out NICs); the cell records the placement. A cell's winner buys fewer GPUs (whole scale-up domains, then GPUs used); equal GPUs go to the lower p99 TTFT. A mode
the planner cannot fit to the SLOs (a floor above them, nothing placeable) loses the cell to one that fits; a cell
neither fits is reported as such. The p99 figures are the planner's estimates: TTFT p99 = the p99 prompt's prefill,
transfer and window steps plus the M/G/1 p99 wait at the planned P utilisation; ITL p99 = the decode step at the
planned batch, with a window chunk in it for the asymmetric D (the steps its requests see while windows run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .errors import PlanInputError
from .gpus import gpu
from .layout import LayoutError, Placement
from .planner import PlanOptions, plan
from .sim import Slo
from .transfer_model import Mode
from .workload import preset

CONTENDERS = (Mode.ASYM, Mode.SYMMETRIC)


@dataclass(frozen=True)
class CompareGrid:
    """The workload grid: preset mixes x request rates x (TTFT, ITL) SLOs in seconds x GPU types."""

    workloads: tuple[str, ...] = ("chat", "summarization", "reasoning", "deepseek")
    rates_rps: tuple[float, ...] = (5.0, 50.0)
    slos: tuple[tuple[float, float], ...] = ((1.5, 0.06), (3.0, 0.03))
    gpus: tuple[str, ...] = ("H100", "H200", "B200", "B300", "GB200-NVL72")

    def __post_init__(self) -> None:
        for name in ("workloads", "rates_rps", "slos", "gpus"):
            if not getattr(self, name):
                raise PlanInputError(f"compare grid needs at least one of {name}")
        for w in self.workloads:
            preset(w)
        for g in self.gpus:
            gpu(g)
        for ttft, itl in self.slos:
            Slo(ttft, itl)

    def as_dict(self) -> dict:
        return {"workloads": list(self.workloads), "rates_rps": list(self.rates_rps),
                "slos": [{"ttft_ms": t * 1000, "itl_ms": i * 1000} for t, i in self.slos], "gpus": list(self.gpus)}


def _side(result: dict) -> dict:
    dec = result["decode"]
    itl = dec["step_with_window_chunk_ms"] if result["mode"] == Mode.ASYM.value else dec["step_ms"]
    return {"gpus_in_domains": result["gpus_in_domains"], "gpus_used": result["total_gpus"],
            "prefill_gpus": result["prefill_gpus"], "decode_gpus": result["decode_gpus"],
            "ttft_p99_ms": round(result["ttft_estimate_ms"]["p99_at_plan_load"], 2), "itl_p99_ms": round(itl, 3),
            "decode_batch_per_rank": dec["batch_per_rank"], "decode_gpus_per_replica": dec["gpus_per_replica"],
            "prefill_gpus_per_replica": result["prefill"]["gpus_per_replica"]}


def _key(side: dict) -> tuple:
    return side["gpus_in_domains"], side["gpus_used"], side["ttft_p99_ms"]


def compare_cell(workload: str, rate_rps: float, slo: Slo, gpu_name: str, options: PlanOptions) -> dict:
    """Both plans of one cell and the verdict."""
    sides: dict[str, dict] = {}
    efficiency = None
    for mode in CONTENDERS:
        try:
            try:
                result = plan(preset(workload), rate_rps, slo, gpu(gpu_name), mode, options)
            except LayoutError:
                result = plan(preset(workload), rate_rps, slo, gpu(gpu_name), mode,
                              replace(options, placement=Placement.ANY))
        except PlanInputError as exc:  # SLO floors, or a unit no placement fits: the mode cannot serve this cell
            sides[mode.value] = {"infeasible": str(exc)}
            continue
        efficiency = result["efficiency"]
        sides[mode.value] = {**_side(result), "placement": result["serving_unit"]["placement"]}
    asym, sym = sides[Mode.ASYM.value], sides[Mode.SYMMETRIC.value]
    cell = {"workload": workload, "rate_rps": rate_rps, "ttft_slo_ms": slo.ttft_s * 1000, "itl_slo_ms": slo.itl_s * 1000,
            "gpu": gpu(gpu_name).name, "asym": asym, "symmetric": sym, "efficiency": efficiency}
    if "infeasible" in asym and "infeasible" in sym:
        cell["winner"] = "neither"
        return cell
    if "infeasible" in asym or "infeasible" in sym:
        cell["winner"] = "symmetric" if "infeasible" in asym else "asym"
        return cell
    cell["winner"] = "asym" if _key(asym) < _key(sym) else "symmetric" if _key(sym) < _key(asym) else "tie"
    cell["gpus_saved"] = sym["gpus_in_domains"] - asym["gpus_in_domains"]
    cell["gpus_used_saved"] = sym["gpus_used"] - asym["gpus_used"]
    cell["gpus_saved_share"] = round(cell["gpus_used_saved"] / sym["gpus_used"], 4)
    cell["ttft_p99_ratio"] = round(asym["ttft_p99_ms"] / sym["ttft_p99_ms"], 4)
    cell["itl_p99_ratio"] = round(asym["itl_p99_ms"] / sym["itl_p99_ms"], 4)
    return cell


def compare(grid: CompareGrid = CompareGrid(), options: PlanOptions = PlanOptions()) -> dict:
    """Every cell of the grid, and per GPU how many cells each side wins."""
    cells = [compare_cell(w, r, Slo(t, i), g, options)
             for g in grid.gpus for w in grid.workloads for r in grid.rates_rps for t, i in grid.slos]
    per_gpu = {}
    for g in grid.gpus:
        name = gpu(g).name
        mine = [c for c in cells if c["gpu"] == name]
        both = [c for c in mine if "gpus_saved_share" in c]
        per_gpu[name] = {"cells": len(mine), **{w: sum(c["winner"] == w for c in mine)
                                                for w in ("asym", "symmetric", "tie", "neither")},
                         "gpus_used_saved_share_range": [min((c["gpus_saved_share"] for c in both), default=None),
                                                         max((c["gpus_saved_share"] for c in both), default=None)]}
    return {"grid": grid.as_dict(), "baseline": "SGLang's default symmetric PD: P runs bounded replay (layers 0-19 "
            "on every prompt row, layers 20-39 on the last W rows)", "verdict_rule": "fewest GPUs in whole domains, "
            "then GPUs used, then lower TTFT p99", "per_gpu": per_gpu, "cells": cells}


def plot_compare(report: dict, path: str | Path) -> Path:
    """Two heat maps over (workload, rate, SLO) x GPU: GPUs used saved by asym (share of symmetric's) and asym's
    TTFT p99 over symmetric's; cells only one side serves are marked with its name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = report["grid"]
    gpus = [gpu(g).name for g in grid["gpus"]]
    rows = [(w, r, s["ttft_ms"], s["itl_ms"]) for w in grid["workloads"] for r in grid["rates_rps"] for s in grid["slos"]]
    index = {(c["workload"], c["rate_rps"], c["ttft_slo_ms"], c["itl_slo_ms"], c["gpu"]): c for c in report["cells"]}
    fig, axes = plt.subplots(1, 2, figsize=(16, 0.45 * len(rows) + 2.5))
    for ax, key, title, cmap, center in ((axes[0], "gpus_saved_share", "GPUs saved by asym (share of symmetric's)",
                                          "RdYlGn", 0.0),
                                         (axes[1], "ttft_p99_ratio", "TTFT p99 asym / symmetric", "RdYlGn_r", 1.0)):
        values = np.full((len(rows), len(gpus)), np.nan)
        for i, row in enumerate(rows):
            for j, g in enumerate(gpus):
                cell = index[(*row, g)]
                if key in cell:
                    values[i, j] = cell[key]
                    text = f"{cell[key]:+.0%}" if key == "gpus_saved_share" else f"{cell[key]:.2f}"
                else:
                    text = {"asym": "asym only", "symmetric": "sym only", "neither": "neither"}[cell["winner"]]
                ax.text(j, i, text, ha="center", va="center", fontsize=7)
        spread = np.nanmax(np.abs(values - center)) if np.isfinite(values).any() else 1.0
        ax.imshow(values, cmap=cmap, vmin=center - spread, vmax=center + spread, aspect="auto")
        ax.set_xticks(range(len(gpus)), gpus, fontsize=8)
        ax.set_yticks(range(len(rows)), [f"{w} {r:g}/s ttft {t:g} itl {i:g} ms" for w, r, t, i in rows], fontsize=7)
        ax.set_title(title)
    fig.suptitle("Asymmetric PD vs SGLang's default symmetric PD (bounded replay), planner estimates")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
