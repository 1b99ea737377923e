"""The planner: replicas per pool, memory fit, transfer, serving-unit layout and alarms for a workload, rate, SLOs,
GPU and serving mode, from the GPU step-time model (and, on request, checked by the simulator).

Sizing, per mode (docs/planning.md has the derivation):
  D: the largest batch per DP rank whose step (plus one window chunk under the budget policy) meets the ITL
     SLO, capped by the requests the rank's free HBM holds at the mean context (and by max_running when set);
     every D replica size is tried, those whose single-request step misses the ITL SLO are skipped; ranks needed by Little's law
     (rate x output tokens x step time / batch), at `decode_utilization`.
  P: prefill GPU-seconds per request from the role's tokens/s per GPU; replicas at a utilisation low enough
     that the p99 queueing wait (M/G/1, exponential tail) plus the p99 prompt's prefill, transfer and D's
     window steps meet the TTFT SLO.
  Colocated: one pool of full replicas doing both, prefill folded into the steps.
A serving unit holds b P and d D replicas; under same-domain placement it must fit one scale-up domain and
(b, d) is the one that needs the fewest whole domains, since GPUs come in domains. Among D replica sizes the
plan with the fewest GPUs in domains wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..config import DEFAULT_WINDOW
from ..footprint import FitAssumptions
from ..sched import SchedulerConfig
from ..sched.config import DEFAULT_WINDOW_CHUNK
from .alarms import suggested_alarms
from .calibration import Calibrated, load_efficiency
from .errors import PlanInputError
from .gpu_model import Efficiency, GpuStepModel
from .gpus import GpuSpec
from .layout import LayoutError, Placement, ServingUnit, dry_run
from .memory import REPLICA_SIZES, min_replica_gpus, replica_fit
from .share import prefill_share
from .sim import ClusterConfig, Slo, check_rate, poisson_requests, prefill_role_of, simulate
from .steptime import Role
from .transfer_model import Link, Mode, payload_bytes
from .workload import Workload

WINDOW = DEFAULT_WINDOW
RFC_URL = "https://github.com/vllm-project/vllm/issues/57738"


@dataclass(frozen=True)
class PlanOptions:
    """Knobs with defaults an operator may override."""

    placement: Placement = Placement.SAME_DOMAIN
    domain_gpus: int | None = None  # None: the GPU's own NVLink domain
    decode_gpus: int | None = None  # None: every D replica size that fits is tried; the cheapest plan wins
    prefill_gpus: int | None = None  # None: the smallest P replica that holds the role's weights and a prompt
    max_running_per_rank: int | None = None  # None: free HBM / KV per request bounds the decode batch
    window_chunk: int | None = DEFAULT_WINDOW_CHUNK  # None: whole windows (no chunking)
    policy: str = "budget"
    prefill_chunk: int = 8192
    decode_utilization: float = 0.85
    max_prefill_utilization: float = 0.8
    efficiency: Efficiency | None = None  # None: the calibration file's, else the assumed defaults
    calibration: str | None = None  # calibration file (None: $SGLANG_ASYM_PLAN_CALIBRATION or the package's)
    fit: FitAssumptions = field(default_factory=FitAssumptions)
    sample_requests: int = 2000  # workload draws for the length statistics
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", Placement(self.placement))
        if not 0 < self.decode_utilization <= 1 or not 0 < self.max_prefill_utilization < 1:
            raise PlanInputError("utilisation targets must be in (0, 1]")
        if (self.max_running_per_rank is not None and self.max_running_per_rank < 1) or self.prefill_chunk < 1:
            raise PlanInputError("max_running_per_rank and prefill_chunk must be >= 1")


def _efficiency(options: PlanOptions) -> Efficiency:
    """The options' efficiencies; unresolved (None) outside plan(): the assumed defaults."""
    return options.efficiency or Efficiency()


def _stats(workload: Workload, options: PlanOptions) -> dict:
    pairs = workload.sample(options.sample_requests, options.seed)
    prompts = sorted(p for p, _ in pairs)
    outputs = [o for _, o in pairs]
    return {"pairs": pairs, "mean_prompt": sum(prompts) / len(prompts), "mean_output": sum(outputs) / len(outputs),
            "p99_prompt": prompts[min(len(prompts) - 1, int(0.99 * len(prompts)))]}


def prefill_role(mode: Mode) -> Role:
    return prefill_role_of(mode)


def prefill_tokens(mode: Mode, prompt: int) -> int:
    return max(prompt - WINDOW, 0) if mode is Mode.ASYM else prompt


def link_for(gpu: GpuSpec, placement: Placement) -> Link:
    """KV goes over NVLink when P and D share a domain (same-domain units), else over the scale-out NICs (any
    placement may put them in different domains: sized for that); 1 ms per request for the handshake."""
    if placement is Placement.SAME_DOMAIN:
        return Link("nvlink", gpu.nvlink_bytes_per_s, 1e-3)
    return Link("rdma", gpu.rdma_bytes_per_s, 1e-3)


def sched_config(batch: int, options: PlanOptions) -> SchedulerConfig:
    chunk = options.window_chunk
    budget = batch + (chunk if chunk is not None else WINDOW)
    return SchedulerConfig(token_budget=budget, max_window_rows_per_step=max(budget, WINDOW), max_running=batch,
                           num_draft_tokens=0, window=WINDOW, policy=options.policy,
                           window_chunk=chunk if options.policy == "budget" else None, max_waiting=1 << 20)


@dataclass(frozen=True)
class DecodeSizing:
    gpus: int
    batch_per_rank: int
    step_s: float  # decode-only step at that batch
    step_with_window_s: float  # plus one window chunk (what a request's ITL sees while windows run)
    tokens_per_gpu_s: float
    limited_by: str


def size_decode(gpu: GpuSpec, mode: Mode, context: int, slo: Slo, options: PlanOptions, gpus: int) -> DecodeSizing:
    """The largest per-rank batch of a D replica of `gpus` GPUs whose step meets the ITL SLO."""
    model = GpuStepModel(gpu, gpus, Role.FULL, _efficiency(options))
    fit = replica_fit(Role.FULL, gpu, gpus, context, options.fit)
    cap_memory = fit.max_requests_at_context // gpus  # each DP rank keeps its own requests' KV on its GPU
    cap = cap_memory if options.max_running_per_rank is None else min(options.max_running_per_rank, cap_memory)
    if cap < 1:
        raise PlanInputError(f"a D replica of {gpus} {gpu.name} holds no request of {context} tokens")
    window = mode in (Mode.ASYM, Mode.RFC57738)
    chunk = (options.window_chunk or WINDOW) if window else 0

    def worst(b: int) -> float:
        return model.decode_step_s([context] * b, [chunk] if chunk else [])

    floor = worst(1)
    if floor > slo.itl_s:
        raise PlanInputError(f"ITL SLO {slo.itl_s * 1000:.1f} ms is below the physical floor: one decode step of a "
                             f"single request on {gpus} {gpu.name} takes {floor * 1000:.1f} ms")
    lo, hi = 1, cap
    while lo < hi:  # step time grows with the batch: largest b with worst(b) <= SLO
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if worst(mid) <= slo.itl_s else (lo, mid - 1)
    b = lo
    limited = "itl_slo" if b < cap else ("kv_memory" if cap == cap_memory else "max_running")
    step = model.decode_step_s([context] * b)
    return DecodeSizing(gpus, b, step, worst(b), b / step, limited)


def _wait_mean(rho: float, mean_s: float, second_moment: float) -> float:
    """M/G/1 mean wait in queue (Pollaczek-Khinchine): rho * E[S^2] / (2 E[S] (1 - rho))."""
    return rho * second_moment / (2 * mean_s * (1 - rho)) if mean_s > 0 else 0.0


def _wait_p99(rho: float, mean_s: float, second_moment: float) -> float:
    """p99 wait of an M/G/1 queue with an exponential tail: P(wait > 0) = rho, conditional mean W / rho."""
    if rho <= 0.01 or mean_s <= 0:
        return 0.0
    return _wait_mean(rho, mean_s, second_moment) / rho * math.log(rho / 0.01)


def plan(workload: Workload, rate_rps: float, slo: Slo, gpu: GpuSpec, mode: Mode | str,
         options: PlanOptions = PlanOptions(), simulate_unit: bool = False, sim_requests: int = 400,
         progress: bool = False) -> dict:
    """A full plan as a JSON-ready dict (see the module docstring)."""
    mode = Mode.parse(mode)
    calibrated = load_efficiency(gpu.name, options.calibration) if options.efficiency is None else \
        Calibrated(options.efficiency, "given by the caller")
    options = replace(options, efficiency=calibrated.efficiency)
    check_rate(rate_rps)
    domain = options.domain_gpus or gpu.domain_gpus
    st = _stats(workload, options)
    context = int(st["mean_prompt"] + st["mean_output"] / 2)  # a running request's mean context

    # ---- decode pool ----
    sizes = [options.decode_gpus] if options.decode_gpus else [n for n in REPLICA_SIZES if n <= domain]
    candidates, too_slow = [], []
    for n in sizes:
        if not replica_fit(Role.FULL, gpu, n, context, options.fit).fits:
            continue
        try:  # a small replica may miss the ITL SLO where a bigger one (more HBM bandwidth per step) meets it
            candidates.append(size_decode(gpu, mode, context, slo, options, n))
        except PlanInputError as exc:
            too_slow.append(exc)
    if not candidates:
        if too_slow:
            raise too_slow[-1]  # the largest replica's reason: the lowest floor there is
        raise PlanInputError(f"no D replica of up to {domain} {gpu.name} GPUs holds the full model")
    plans, refusals = [], []
    for dec in candidates:
        try:
            plans.append(_plan_with_decode(rate_rps, slo, gpu, mode, options, st, context, domain, dec))
        except LayoutError as exc:
            refusals.append(exc)
    if not plans:
        raise refusals[-1]
    # fewest GPUs bought (whole domains), then fewest used; among equals the faster decode
    result, unit, dec, link = min(plans, key=lambda r: (r[0]["gpus_in_domains"], r[0]["total_gpus"],
                                                        -r[0]["throughput_per_gpu"]["decode_tokens_s"]))
    result["workload"] = workload.name
    result["efficiency"] = calibrated.as_dict()
    if simulate_unit:
        result["simulation"] = simulate_plan_unit(workload, rate_rps / result["units"], slo, gpu, mode, unit, dec,
                                                  options, link, sim_requests, progress)
    return result


def _plan_with_decode(rate_rps: float, slo: Slo, gpu: GpuSpec, mode: Mode, options: PlanOptions, st: dict,
                      context: int, domain: int, dec: DecodeSizing) -> tuple[dict, ServingUnit, DecodeSizing, Link]:
    window_steps = 0 if mode in (Mode.SYMMETRIC, Mode.SYMMETRIC_FULL, Mode.COLOCATED) else -(-WINDOW // (options.window_chunk or WINDOW))
    decode_s_per_request = (st["mean_output"] + window_steps) * dec.step_s  # seconds a request holds a slot
    concurrency = rate_rps * decode_s_per_request
    d_ranks = concurrency / (dec.batch_per_rank * options.decode_utilization)

    # ---- prefill pool ----
    role = prefill_role(mode)
    p_tokens = sum(prefill_tokens(mode, p) for p, _ in st["pairs"]) / len(st["pairs"])
    if mode is Mode.COLOCATED:
        p_fit = None
        p_gpus = dec.gpus
    else:
        if options.prefill_gpus:
            p_fit = replica_fit(role, gpu, options.prefill_gpus, int(st["mean_prompt"]), options.fit)
            if not p_fit.fits or p_fit.max_requests_at_context < 1:
                raise PlanInputError(f"a P replica ({role.value}) of {options.prefill_gpus} {gpu.name} GPUs does not hold "
                                     f"its weights and one {int(st['mean_prompt'])}-token prompt")
        else:
            p_fit = min_replica_gpus(role, gpu, int(st["mean_prompt"]), 1, options.fit)
        p_gpus = p_fit.gpus
    p_model = GpuStepModel(gpu, p_gpus, role, _efficiency(options))
    # a loaded P packs several prompts into full chunks: GPU-seconds at that rate (TTFT uses one prompt alone)
    rp = p_model.prefill_tokens_per_gpu_s(role, options.prefill_chunk, options.prefill_chunk) if p_tokens else math.inf
    # service time of each sampled prompt alone on a replica: its mean, second moment and p99 (M/G/1 queueing)
    services = sorted(p_model.prefill_s(prefill_tokens(mode, p), role) for p, _ in st["pairs"])
    p_service = sum(services) / len(services)
    p_service_sq = sum(x * x for x in services) / len(services)
    p_service_p99 = services[min(len(services) - 1, int(0.99 * len(services)))]
    link = link_for(gpu, options.placement)
    mean_bytes = payload_bytes(mode, max(int(st["mean_prompt"]), 1))
    transfer_s = link.wire_s(mean_bytes) if mode is not Mode.COLOCATED else 0.0
    transfer_p99_s = link.wire_s(payload_bytes(mode, st["p99_prompt"])) if mode is not Mode.COLOCATED else 0.0
    window_s = window_steps * dec.step_with_window_s
    floor = p_service + transfer_s + window_s + dec.step_s
    floor_p99 = p_service_p99 + transfer_p99_s + window_s + dec.step_s
    if floor_p99 > slo.ttft_s:
        raise PlanInputError(f"TTFT SLO {slo.ttft_s * 1000:.0f} ms is below the physical floor: the p99 prompt "
                             f"({st['p99_prompt']} tokens) needs {floor_p99 * 1000:.0f} ms on an idle {mode.value} "
                             f"deployment of {gpu.name}")
    # the highest utilisation whose p99 queueing wait keeps the p99 TTFT within the SLO, at most the cap
    rho = options.max_prefill_utilization
    while rho > 0.05 and floor_p99 + _wait_p99(rho, p_service, p_service_sq) > slo.ttft_s:
        rho -= 0.05
    p_gpu_s_per_request = p_tokens / rp if p_tokens else 0.0
    if mode is Mode.COLOCATED:
        # one pool: prefill GPU-seconds and decode slots add up on the same replicas
        replicas = math.ceil(rate_rps * p_gpu_s_per_request / (dec.gpus * rho) + d_ranks / dec.gpus)
        p_replicas, d_replicas = 0, max(replicas, 1)
    else:
        p_replicas = max(math.ceil(rate_rps * p_gpu_s_per_request / (p_gpus * rho)), 1)
        d_replicas = max(math.ceil(d_ranks / dec.gpus), 1)

    # ---- serving unit ----
    unit, units = _unit(p_gpus if mode is not Mode.COLOCATED else 0, p_replicas, dec.gpus, d_replicas, domain,
                        options.placement)
    layout = dry_run(unit, domain, options.placement, stage="plan", fleet=gpu.name).as_dict()
    total_gpus = units * unit.total_gpus
    # GPUs come in whole domains: same-domain units pack into domains, the rest spreads over them
    if options.placement is Placement.SAME_DOMAIN:
        domains = math.ceil(units / max(layout["units_per_domain"], 1))
    else:
        domains = math.ceil(total_gpus / domain)
    rd = dec.tokens_per_gpu_s
    result = {
        "mode": mode.value, "gpu": gpu.name, "rate_rps": rate_rps,
        "slo": {"ttft_ms": slo.ttft_s * 1000, "itl_ms": slo.itl_s * 1000},
        "lengths": {"mean_prompt": round(st["mean_prompt"], 1), "mean_output": round(st["mean_output"], 1),
                    "p99_prompt": st["p99_prompt"], "ratio_r": st["mean_prompt"] / st["mean_output"],
                    "prefill_tokens_per_request": round(p_tokens, 1)},
        "throughput_per_gpu": {"prefill_tokens_s": rp, "decode_tokens_s": rd,
                               "throughput_balanced_prefill_share": prefill_share(p_tokens, st["mean_output"], rp, rd)
                               if mode is not Mode.COLOCATED and p_tokens else 0.0},
        "decode": {"gpus_per_replica": dec.gpus, "batch_per_rank": dec.batch_per_rank,
                   "step_ms": dec.step_s * 1000, "step_with_window_chunk_ms": dec.step_with_window_s * 1000,
                   "batch_limited_by": dec.limited_by, "replicas": units * unit.decode_replicas},
        "prefill": None if mode is Mode.COLOCATED else {
            "gpus_per_replica": p_gpus, "role": role.value, "utilization_target": round(rho, 2),
            "seconds_per_mean_prompt": p_service, "replicas": units * unit.prefill_replicas},
        "memory": {"decode_replica": replica_fit(Role.FULL, gpu, dec.gpus, context, options.fit).as_dict(),
                   "prefill_replica": None if p_fit is None else p_fit.as_dict()},
        "transfer": {"link": link.name, "bytes_mean_prompt": mean_bytes,
                     "bytes_p99_prompt": payload_bytes(mode, st["p99_prompt"]) if mode is not Mode.COLOCATED else 0,
                     "seconds_mean_prompt": transfer_s,
                     "ttft_break_even_vs_symmetric_tokens": break_even_prompt(gpu, mode, dec.gpus, link, options)},
        "ttft_estimate_ms": {"idle_mean_prompt": floor * 1000, "idle_p99_prompt": floor_p99 * 1000,
                             "mean_at_plan_load": (floor + _wait_mean(rho, p_service, p_service_sq)) * 1000,
                             "p99_at_plan_load": (floor_p99 + _wait_p99(rho, p_service, p_service_sq)) * 1000},
        "serving_unit": layout, "units": units, "total_gpus": total_gpus,
        "domains": domains, "gpus_in_domains": domains * domain,
        "prefill_gpus": units * unit.prefill_total, "decode_gpus": units * unit.decode_gpus * unit.decode_replicas,
        "alarms": suggested_alarms(slo, dec, rho),
    }
    if mode is Mode.RFC57738:
        result["rfc57738"] = RFC_URL
    return result, unit, dec, link


def _unit(p_gpus: int, p_replicas: int, d_gpus: int, d_replicas: int, domain: int,
          placement: Placement) -> tuple[ServingUnit, int]:
    """The serving unit and how many of them. Same-domain: every unit of b P and d D replicas that fits a domain
    is tried; the one needing the fewest whole domains (then the fewest GPUs) wins. Any placement: the smallest
    unit in the needed P:D ratio (units may span domains)."""
    if placement is Placement.SAME_DOMAIN:
        best = None
        for b in (range(0, 1) if p_gpus == 0 else range(1, domain // p_gpus + 1)):
            for d in range(1, (domain - b * p_gpus) // d_gpus + 1):
                unit = ServingUnit(p_gpus, b, d_gpus, d)
                units = max(-(-p_replicas // b) if b else 0, -(-d_replicas // d))
                domains = -(-units // (domain // unit.total_gpus))
                key = (domains, units * unit.total_gpus, unit.total_gpus)
                if best is None or key < best[0]:
                    best = (key, unit, units)
        if best is None:  # not even one P + one D replica fits: the dry run says so
            return ServingUnit(p_gpus, 1 if p_gpus else 0, d_gpus, 1), 1
        return best[1], best[2]
    if p_gpus == 0:
        return ServingUnit(0, 0, d_gpus, 1), d_replicas
    ratio, best = p_replicas / d_replicas, None
    for d in range(1, d_replicas + 1):
        b = max(1, math.ceil(ratio * d - 1e-9))
        best = ServingUnit(p_gpus, b, d_gpus, d)
        if abs(b / d - ratio) <= 0.05 * ratio:
            break
    return best, max(-(-p_replicas // best.prefill_replicas), -(-d_replicas // best.decode_replicas))


def idle_ttft_s(gpu: GpuSpec, mode: Mode, prompt: int, d_gpus: int, link: Link, options: PlanOptions) -> float:
    """TTFT of one prompt on an idle deployment: P's compute on its smallest replica, the payload's wire time, then
    D's window chunks (asym, RFC) or one step to join (symmetric); colocated: a full prefill on the D replica."""
    d = GpuStepModel(gpu, d_gpus, Role.FULL, _efficiency(options))
    if mode is Mode.COLOCATED:
        return d.prefill_s(prompt, Role.FULL) + d.decode_step_s([prompt])
    role = prefill_role(mode)
    p_gpus = min_replica_gpus(role, gpu, prompt, 1, options.fit).gpus
    p = GpuStepModel(gpu, p_gpus, role, _efficiency(options))
    tokens = prefill_tokens(mode, prompt)
    wire = link.wire_s(payload_bytes(mode, prompt)) if payload_bytes(mode, prompt) else 0.0
    if mode in (Mode.SYMMETRIC, Mode.SYMMETRIC_FULL):
        return p.prefill_s(tokens, role) + wire + d.decode_step_s([prompt])
    chunk = options.window_chunk or WINDOW
    window_rows = min(prompt, WINDOW)
    steps = -(-window_rows // chunk)
    return p.prefill_s(tokens, role) + wire + steps * d.decode_step_s([], [min(chunk, window_rows)])


def break_even_prompt(gpu: GpuSpec, mode: Mode, d_gpus: int, link: Link, options: PlanOptions) -> int | None:
    """The prompt length (tokens) from which on the mode's idle TTFT beats symmetric PD's (each with its smallest P
    replica): above the last power of two where it loses, bisected. Short prompts may win too (N <= W needs no P
    at all). None for symmetric and colocated, or if it still loses at 1M tokens."""
    if mode in (Mode.SYMMETRIC, Mode.SYMMETRIC_FULL, Mode.COLOCATED):
        return None

    def gain(n: int) -> float:
        return idle_ttft_s(gpu, Mode.SYMMETRIC, n, d_gpus, link, options) - idle_ttft_s(gpu, mode, n, d_gpus, link,
                                                                                         options)

    powers = [1 << i for i in range(21) if (1 << i) <= (1 << 20) - WINDOW]
    losing = [n for n in powers if gain(n) <= 0]
    if not losing:
        return 1
    lo = losing[-1]
    if lo == powers[-1]:
        return None
    hi = lo * 2
    while hi - lo > 1:  # the crossing above the last losing power of two
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if gain(mid) > 0 else (mid, hi)
    return hi


SIM_RANKS = 8  # DP ranks simulated per D replica: a slice of the unit (step times still for the whole replica)


def simulate_plan_unit(workload: Workload, unit_rate: float, slo: Slo, gpu: GpuSpec, mode: Mode, unit: ServingUnit,
                       dec: DecodeSizing, options: PlanOptions, link: Link, n_requests: int, progress: bool) -> dict:
    """Simulate a slice of one serving unit with the real scheduler: one D replica's first SIM_RANKS DP ranks
    (their steps timed for the whole replica) and the P replicas that share of the rate needs (at least one)."""
    role = prefill_role(mode)
    ranks = min(dec.gpus, SIM_RANKS)
    fraction = ranks / (dec.gpus * unit.decode_replicas)
    p_replicas = max(1, round(unit.prefill_replicas * fraction)) if unit.prefill_replicas else 0
    cfg = ClusterConfig(
        mode, GpuStepModel(gpu, dec.gpus, Role.FULL, _efficiency(options)), sched_config(dec.batch_per_rank, options),
        prefill_model=None if mode is Mode.COLOCATED else GpuStepModel(gpu, unit.prefill_gpus, role, _efficiency(options)),
        prefill_replicas=p_replicas, decode_replicas=1, decode_ranks=ranks,
        prefill_gpus=unit.prefill_gpus or 1, decode_gpus=ranks, prefill_chunk=options.prefill_chunk, link=link)
    rate = unit_rate * fraction
    requests = poisson_requests(workload.sample(n_requests, options.seed + 1), rate, options.seed + 2)
    summary = simulate(cfg, requests, slo, progress=progress, warmup_s=0.0).summary
    summary["slice"] = {"decode_ranks": ranks, "of_replica_gpus": dec.gpus, "prefill_replicas": p_replicas,
                        "rate_rps": rate, "share_of_unit": fraction}
    return summary
