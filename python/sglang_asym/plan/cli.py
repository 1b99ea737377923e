"""`python -m sglang_asym.plan`: share, dry-run, plan, compare, steptime and gpus subcommands, each printing one JSON
object.

Exit status: 0 done; 1 a serving unit the fleet cannot place (dry-run / plan), printed as the operator's
`error  stage ...` line on stderr; 2 bad input (argparse's status), with the reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict

from ..sched.config import DEFAULT_WINDOW_CHUNK
from .errors import PlanInputError
from .gpu_model import GpuStepModel
from .gpus import GPUS, gpu
from .layout import LayoutError, Placement, ServingUnit, dry_run
from .compare import CompareGrid, compare, plot_compare
from .planner import PlanOptions, plan
from .plots import plot_plans
from .share import share_report
from .sim import Slo
from .steptime import Role
from .transfer_model import Mode
from .workload import PRESETS, LengthDist, Workload, preset


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang_asym.plan", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("share", help="throughput-balanced prefill share r / (r + R_p / R_d)")
    s.add_argument("--input-tokens", type=float, required=True)
    s.add_argument("--output-tokens", type=float, required=True)
    s.add_argument("--prefill-tokens-per-gpu", type=float, required=True)
    s.add_argument("--decode-tokens-per-gpu", type=float, required=True)

    d = sub.add_parser("dry-run", help="place a serving unit in scale-up domains")
    d.add_argument("--domain-gpus", type=int, required=True)
    d.add_argument("--prefill-gpus", type=int, required=True, help="GPUs per prefill replica")
    d.add_argument("--prefill-replicas", type=int, required=True)
    d.add_argument("--decode-gpus", type=int, required=True, help="GPUs per decode replica")
    d.add_argument("--decode-replicas", type=int, required=True)
    d.add_argument("--placement", choices=[p.value for p in Placement], default=Placement.SAME_DOMAIN.value)
    d.add_argument("--stage", default="plan")
    d.add_argument("--fleet", default="fleet")

    p = sub.add_parser("plan", help="replicas, memory, transfer, layout and alarms for a workload")
    p.add_argument("--workload", choices=sorted(PRESETS), help="a preset mix (or give --input-mean / --output-mean)")
    p.add_argument("--input-mean", type=float, help="mean prompt tokens (lognormal, --sigma)")
    p.add_argument("--output-mean", type=float, help="mean output tokens (lognormal, --sigma)")
    p.add_argument("--sigma", type=float, default=0.6)
    p.add_argument("--rate", type=float, required=True, help="requests per second")
    p.add_argument("--ttft-ms", type=float, default=1500.0)
    p.add_argument("--itl-ms", type=float, default=60.0)
    p.add_argument("--gpu", required=True, help=f"one of {sorted(GPUS)}")
    p.add_argument("--mode", default="asym", help=f"one of {[m.value for m in Mode]} or 'all'")
    p.add_argument("--placement", choices=[x.value for x in Placement], default=Placement.SAME_DOMAIN.value)
    p.add_argument("--domain-gpus", type=int, help="override the GPU's NVLink domain size")
    p.add_argument("--decode-gpus", type=int, help="force the D replica size")
    p.add_argument("--prefill-gpus", type=int, help="force the P replica size")
    p.add_argument("--window-chunk", type=int, default=DEFAULT_WINDOW_CHUNK, help="window rows per step (0: whole windows)")
    p.add_argument("--policy", choices=["budget", "admit_all"], default="budget")
    p.add_argument("--simulate", action="store_true", help="also simulate a slice of one serving unit")
    p.add_argument("--sim-requests", type=int, default=400)
    p.add_argument("--progress", action="store_true", help="progress bar while simulating")
    p.add_argument("--plot", help="with --simulate: write TTFT / ITL quantiles and GPUs per mode to this PNG")
    p.add_argument("--calibration", help="measured MBU / MFU file (plan.calibration; default: assumed values)")
    p.add_argument("--max-running-per-rank", type=int, help="cap the decode batch per DP rank (default: HBM bounds it)")

    c = sub.add_parser("compare", help="asym vs SGLang's default symmetric PD (bounded replay) over a workload grid")
    c.add_argument("--workloads", nargs="+", default=list(CompareGrid.workloads), choices=sorted(PRESETS))
    c.add_argument("--rates", nargs="+", type=float, default=list(CompareGrid.rates_rps), help="requests per second")
    c.add_argument("--slo", nargs="+", default=[f"{t * 1000:g}:{i * 1000:g}" for t, i in CompareGrid.slos],
                   help="TTFT_MS:ITL_MS pairs")
    c.add_argument("--gpus", nargs="+", default=list(CompareGrid.gpus))
    c.add_argument("--calibration", help="measured MBU / MFU file (plan.calibration; default: assumed values)")
    c.add_argument("--plot", help="write the heat maps to this PNG")

    t = sub.add_parser("steptime", help="step times of one replica (roofline model)")
    t.add_argument("--gpu", required=True)
    t.add_argument("--gpus", type=int, default=8, help="GPUs in the replica")
    t.add_argument("--batch", type=int, default=64, help="decode rows per DP rank")
    t.add_argument("--context", type=int, default=4096)
    t.add_argument("--window-rows", type=int, default=0)
    t.add_argument("--prefill-tokens", type=int, default=8192)

    sub.add_parser("gpus", help="the GPU specifications the planner knows")
    return parser


def _workload(args: argparse.Namespace) -> Workload:
    if args.workload:
        if args.input_mean is not None or args.output_mean is not None:
            raise PlanInputError("give either --workload or --input-mean/--output-mean, not both")
        return preset(args.workload)
    if args.input_mean is None or args.output_mean is None:
        raise PlanInputError("a plan needs --workload PRESET or both --input-mean and --output-mean")
    return Workload("custom", LengthDist.lognormal(args.input_mean, args.sigma),
                    LengthDist.lognormal(args.output_mean, args.sigma))


def _run(args: argparse.Namespace) -> dict:
    if args.command == "share":
        return share_report(args.input_tokens, args.output_tokens, args.prefill_tokens_per_gpu,
                            args.decode_tokens_per_gpu)
    if args.command == "dry-run":
        unit = ServingUnit(args.prefill_gpus, args.prefill_replicas, args.decode_gpus, args.decode_replicas)
        return dry_run(unit, args.domain_gpus, args.placement, args.stage, args.fleet).as_dict()
    if args.command == "compare":
        slos = []
        for pair in args.slo:
            try:
                ttft, itl = (float(x) / 1000 for x in pair.split(":"))
            except ValueError:
                raise PlanInputError(f"--slo takes TTFT_MS:ITL_MS pairs, got {pair!r}") from None
            slos.append((ttft, itl))
        grid = CompareGrid(tuple(args.workloads), tuple(args.rates), tuple(slos), tuple(args.gpus))
        report = compare(grid, PlanOptions(calibration=args.calibration))
        if args.plot:
            plot_compare(report, args.plot)
        return report
    if args.command == "gpus":
        return {name: asdict(spec) for name, spec in GPUS.items()}
    if args.command == "steptime":
        spec = gpu(args.gpu)
        d = GpuStepModel(spec, args.gpus, Role.FULL)
        chunks = [args.window_rows] if args.window_rows else []
        return {"gpu": spec.name, "gpus": args.gpus, "batch_per_rank": args.batch, "context": args.context,
                "decode_step_ms": 1000 * d.decode_step_s([args.context] * args.batch, chunks),
                "decode_tokens_per_gpu_s": d.decode_tokens_per_gpu_s(args.batch, args.context) if args.batch else 0,
                "prefill_tokens_per_gpu_s": {r.value: GpuStepModel(spec, args.gpus, r).prefill_tokens_per_gpu_s(
                    r, args.prefill_tokens, args.prefill_tokens) for r in Role if r is not Role.LATE}}
    spec = gpu(args.gpu)
    for name in ("rate", "ttft_ms", "itl_ms"):
        v = getattr(args, name)
        if not math.isfinite(v) or v <= 0:
            raise PlanInputError(f"--{name.replace('_', '-')} must be > 0, got {v}")
    slo = Slo(args.ttft_ms / 1000, args.itl_ms / 1000)
    options = PlanOptions(placement=args.placement, domain_gpus=args.domain_gpus, decode_gpus=args.decode_gpus,
                          prefill_gpus=args.prefill_gpus,
                          window_chunk=args.window_chunk or None, policy=args.policy,
                          calibration=args.calibration, max_running_per_rank=args.max_running_per_rank)
    if args.plot and not args.simulate:
        raise PlanInputError("--plot needs --simulate")
    modes = list(Mode) if args.mode == "all" else [Mode.parse(args.mode)]
    plans = {m.value: plan(_workload(args), args.rate, slo, spec, m, options, args.simulate, args.sim_requests,
                           args.progress) for m in modes}
    if args.plot:
        plot_plans(plans, args.plot)
    return plans if len(plans) > 1 else next(iter(plans.values()))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        out = _run(args)
    except LayoutError as exc:
        print(f"error  {exc}", file=sys.stderr)
        return 1
    except PlanInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1, default=str))
    return 0
