"""Plots of simulated plans: TTFT and ITL quantile curves per mode against the SLOs, and GPUs per pool."""

from __future__ import annotations

from pathlib import Path


def plot_plans(plans: dict[str, dict], path: str | Path) -> Path:
    """One figure from `plan(..., simulate_unit=True)` results keyed by mode: TTFT and ITL quantiles of the simulated
    slice (SLOs dashed) and the planned P / D GPUs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    missing = [mode for mode, p in plans.items() if "simulation" not in p]
    if missing:
        raise ValueError(f"plans without a simulation cannot be plotted: {missing} (plan with simulate_unit=True)")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for mode, p in plans.items():
        q = p["simulation"]["quantiles"]
        axes[0].plot(q["q"], [1000 * t for t in q["ttft_s"]], marker="o", label=mode)
        axes[1].plot(q["q"], [1000 * t for t in q["itl_s"]], marker="o", label=mode)
    any_plan = next(iter(plans.values()))
    for ax, key, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
        ax.axhline(any_plan["slo"][key], color="k", ls="--", lw=1, label=f"SLO {any_plan['slo'][key]:g} ms")
        ax.set_xlabel("percentile")
        ax.set_ylabel("ms")
        ax.set_title(f"{title} of a simulated unit slice")
        ax.legend(fontsize=7)
    modes = list(plans)
    axes[2].bar(modes, [plans[m]["prefill_gpus"] for m in modes], color="C1", label="P GPUs")
    axes[2].bar(modes, [plans[m]["decode_gpus"] for m in modes], bottom=[plans[m]["prefill_gpus"] for m in modes],
                color="C0", label="D GPUs")
    axes[2].set_title(f"{any_plan['gpu']}, {any_plan['workload']} at {any_plan['rate_rps']:g} req/s")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
