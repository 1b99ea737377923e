"""Discrete-event simulator of P and D pools behind a router, driving the project's real decode scheduler.

Every decode replica (or DP-attention rank of one) owns a real `sched.Scheduler`: new windows are
`enqueue`d, symmetric PD's transferred requests join with `add_running`, each step is `Scheduler.step()`
(plan_step: budget admission, chunked windows, aging) and finished requests are `finish`ed. A step lasts
what the step-time model says for the rows the plan holds (the slowest rank for DP ranks, which step in
lockstep). Prefill replicas run FIFO prefill steps of up to `prefill_chunk` tokens; a request's rows reach
D after the transfer model's exposed time. The router sends each request to the prefill replica with the
fewest queued tokens and to the decode replica (then rank) holding the fewest requests.

Modes: asym (P runs [0, N - W) on half the layers; D runs the window), rfc57738 (P runs [0, N) on the same
layers; D re-runs the last W), symmetric (P runs the prompt with bounded replay, SGLang's GPU default: layers 0-19
on every row, layers 20-39 on the last W; it samples the first token; D decodes), symmetric-full-compute (the
same with P running every layer on every row: a labelled baseline, what the project's CPU servers ran), colocated (one full-model replica does both: its prefill either runs on its own worker
beside the decode loop, as the project's CPU server does, or is folded into the decode steps, as on a GPU).
Speculative decoding is not simulated (num_draft_tokens must be 0).

Prefill beside decode on shared cores (the CPU servers; off by default): a decode step that starts while a prefill
runs on the same machine takes a fixed extra time, in proportion to the part of the step that prefill keeps running
(all of it when more prefill is queued behind the running chunk; a prefill that starts during a step does not delay
it). `colocated_step_delay_s` is for a colocated replica's own prefix thread: one Python process, so the decode
loop's interpreter-bound per-step work waits for the lock the prefix thread takes between its kernels, a cost per
step rather than per row. `cohosted_step_delay_s` is for a P replica's prefill in another process on the same cores
(every P replica counts as on every D replica's machine, as in the CPU benchmarks). The prefill itself is not
slowed here: the CPU validation scales it by the prefill time the servers reported in that run.
"""

from __future__ import annotations

import heapq
import itertools
import math
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ..config import DEFAULT_WINDOW, V41Config
from ..sched import Scheduler, SchedulerConfig
from .errors import PlanInputError
from .steptime import Role, StepTimeModel
from .transfer_model import Link, Mode, exposed_transfer_s, payload_bytes

WINDOW = DEFAULT_WINDOW
QUANTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)  # of TTFT and ITL, kept in the summary for plots


@dataclass(frozen=True)
class SimRequest:
    rid: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_ready: bool = False  # its prefix state is already on D at arrival (no P, no transfer)

    def __post_init__(self) -> None:
        if not math.isfinite(self.arrival_s) or self.arrival_s < 0:
            raise PlanInputError(f"request {self.rid!r}: arrival must be a finite time >= 0, got {self.arrival_s}")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise PlanInputError(f"request {self.rid!r}: prompt and output need >= 1 token each")


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    itl_s: float

    def __post_init__(self) -> None:
        for name in ("ttft_s", "itl_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise PlanInputError(f"SLO {name} must be a finite number of seconds > 0, got {v!r}")


def prefill_role_of(mode: Mode) -> Role:
    """The work a P replica of `mode` does per prompt (colocated replicas prefill with the full model)."""
    return {Mode.ASYM: Role.ASYM_P, Mode.RFC57738: Role.RFC_P, Mode.SYMMETRIC: Role.SYM_P}.get(mode, Role.FULL)


@dataclass(frozen=True)
class ClusterConfig:
    """Pools, models and policies of one simulated deployment."""

    mode: Mode
    decode_model: StepTimeModel
    sched: SchedulerConfig
    prefill_model: StepTimeModel | None = None  # colocated replicas prefill with decode_model
    prefill_replicas: int = 1
    decode_replicas: int = 1
    decode_ranks: int = 1  # DP-attention ranks per decode replica (one Scheduler each, lockstep steps)
    prefill_gpus: int = 1  # GPUs per prefill replica (per-GPU figures only)
    decode_gpus: int = 1
    prefill_chunk: int = 8192  # tokens per prefill forward
    pack_prefill: bool = True  # several prompts share a prefill forward (GPU); False: one prompt at a time (CPU)
    link: Link = Link("nvlink", 450e9, 1e-3)
    colocated_prefill_in_step: bool = True  # GPU: prefill chunks are part of the decode steps
    colocated_split: bool = False  # the project's null mode: prefix [0, N - W) then a window step
    model_cfg: V41Config = V41Config()  # whose row formats the payload is counted in
    colocated_step_delay_s: float = 0.0  # extra time of a decode step beside the replica's own prefix thread
    cohosted_step_delay_s: float = 0.0  # extra time of a decode step beside a P replica's prefill

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode.parse(self.mode))
        for name in ("colocated_step_delay_s", "cohosted_step_delay_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise PlanInputError(f"{name} must be a finite number of seconds >= 0, got {v!r}")
        if self.sched.num_draft_tokens != 0:
            raise PlanInputError("the simulator does not model speculative decoding: num_draft_tokens must be 0")
        for name in ("decode_replicas", "decode_ranks", "prefill_chunk", "decode_gpus"):
            if getattr(self, name) < 1:
                raise PlanInputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.mode is not Mode.COLOCATED and (self.prefill_replicas < 1 or self.prefill_model is None):
            raise PlanInputError(f"mode {self.mode.value} needs >= 1 prefill replica and a prefill model")

    @property
    def prefill_role(self) -> Role:
        return prefill_role_of(self.mode)

    @property
    def total_gpus(self) -> int:
        p = 0 if self.mode is Mode.COLOCATED else self.prefill_replicas * self.prefill_gpus
        return p + self.decode_replicas * self.decode_gpus

    def prefill_tokens(self, prompt: int) -> int:
        """Prompt tokens the prefill side computes."""
        if self.mode is Mode.ASYM or (self.mode is Mode.COLOCATED and self.colocated_split):
            return max(prompt - WINDOW, 0)
        return prompt

    def window_rows(self, prompt: int) -> int:
        """Rows D runs through the scheduler's window step (0: the request joins decoding directly)."""
        if self.mode in (Mode.ASYM, Mode.RFC57738) or (self.mode is Mode.COLOCATED and self.colocated_split):
            return min(prompt, WINDOW)
        return 0


@dataclass
class _Req:
    spec: SimRequest
    prefill_left: int
    prefill_started: float | None = None
    prefill_done: float | None = None
    at_decode: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    tokens: int = 0
    gaps: array = field(default_factory=lambda: array("d"))
    times: array | None = None

    @property
    def context(self) -> int:
        return self.spec.prompt_tokens + self.tokens


class _Events:
    def __init__(self) -> None:
        self.heap: list = []
        self.seq = itertools.count()
        self.now = 0.0

    def at(self, t: float, fn: Callable, *args) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn, args))


class _PrefillWorker:
    """FIFO prefill of one replica (or a colocated replica's own prefill thread)."""

    def __init__(self, sim: "Simulator", model: StepTimeModel, role: Role, on_done: Callable[[_Req, float], None]):
        self.sim, self.model, self.role, self.on_done = sim, model, role, on_done
        self.queue: deque[_Req] = deque()
        self.busy = False
        self.busy_s = 0.0
        self.runs_until = 0.0  # while busy: the running chunk's end, or inf when more prefill is queued behind it

    def queued_tokens(self) -> int:
        return sum(r.prefill_left for r in self.queue)

    def submit(self, req: _Req) -> None:
        self.queue.append(req)
        if self.busy:
            self.runs_until = math.inf
        else:
            self._start()

    def take_chunk(self) -> list[tuple[_Req, int]]:
        """Pop up to prefill_chunk tokens from the queue head(s) (one prompt only unless packing)."""
        cfg, budget, out = self.sim.cfg, self.sim.cfg.prefill_chunk, []
        for req in self.queue:
            if budget <= 0 or (out and not cfg.pack_prefill):
                break
            n = min(req.prefill_left, budget)
            out.append((req, n))
            budget -= n
        return out

    def _start(self) -> None:
        chunk = self.take_chunk()
        if not chunk:
            self.busy = False
            return
        now = self.sim.events.now
        for req, _ in chunk:
            if req.prefill_started is None:
                req.prefill_started = now
        seconds = self.model.prefill_step_s([(n, self._done_tokens(r)) for r, n in chunk], self.role)
        self.busy = True
        self.busy_s += seconds
        taken = {id(r): n for r, n in chunk}
        more = any(r.prefill_left > taken.get(id(r), 0) for r in self.queue)
        self.runs_until = math.inf if more else now + seconds
        self.sim.events.at(now + seconds, self._finish, chunk)

    def _done_tokens(self, req: _Req) -> int:
        return self.sim.cfg.prefill_tokens(req.spec.prompt_tokens) - req.prefill_left

    def _finish(self, chunk: list[tuple[_Req, int]]) -> None:
        now = self.sim.events.now
        for req, n in chunk:
            req.prefill_left -= n
            if req.prefill_left == 0:
                self.queue.remove(req)
                req.prefill_done = now
                self.on_done(req, n / max(self.sim.cfg.prefill_tokens(req.spec.prompt_tokens), 1))
        self._start()


class _Rank:
    """One DP rank of a decode replica: the real Scheduler plus the requests it holds."""

    def __init__(self, sched: SchedulerConfig) -> None:
        self.scheduler = Scheduler(sched)
        self.reqs: dict[str, _Req] = {}
        self.joins: deque[_Req] = deque()  # transferred running requests waiting for a running slot

    def load(self) -> int:
        return len(self.reqs)


class _DecodeReplica:
    def __init__(self, sim: "Simulator", index: int) -> None:
        cfg = sim.cfg
        self.sim, self.index = sim, index
        self.ranks = [_Rank(cfg.sched) for _ in range(cfg.decode_ranks)]
        self.busy = False
        self.busy_s = 0.0
        self.steps = 0
        self.local_prefill: deque[_Req] = deque()  # colocated, prefill folded into the steps
        self.prefill_worker: _PrefillWorker | None = None

    def load(self) -> int:
        return sum(r.load() for r in self.ranks) + len(self.local_prefill)

    def admit(self, req: _Req) -> None:
        rank = min(self.ranks, key=_Rank.load)
        rank.reqs[req.spec.rid] = req
        req.at_decode = self.sim.events.now
        rows = self.sim.cfg.window_rows(req.spec.prompt_tokens)
        if rows:
            rank.scheduler.enqueue(req.spec.rid, rows)
        else:
            rank.joins.append(req)
        self.kick()

    def kick(self) -> None:
        if not self.busy:
            self._step()

    def _join_waiting(self, rank: _Rank, now: float) -> None:
        cfg = self.sim.cfg.sched
        while rank.joins and len(rank.scheduler.running) < cfg.max_running:
            req = rank.joins.popleft()
            rank.scheduler.add_running(req.spec.rid)
            self.sim.emit_first(req, now)
            self.sim.finish_if_done(req, rank, now)

    def _step(self) -> None:
        now = self.sim.events.now
        for rank in self.ranks:
            self._join_waiting(rank, now)
        planned, seconds = [], 0.0
        model = self.sim.cfg.decode_model
        for rank in self.ranks:
            plan = rank.scheduler.step()
            if plan is None:
                continue
            contexts = [rank.reqs[r.request_id].context for r in plan.decode]
            chunks = [w.window_rows for w in plan.admitted]
            seconds = max(seconds, model.decode_step_s(contexts, chunks))
            planned.append((rank, plan))
        prefill_chunk = self._take_local_prefill()
        if prefill_chunk:
            seconds += model.prefill_step_s([(n, self.sim.cfg.prefill_tokens(r.spec.prompt_tokens) - r.prefill_left)
                                             for r, n in prefill_chunk], Role.FULL)
        if not planned and not prefill_chunk:
            self.busy = False
            return
        seconds = self._beside_prefill(now, seconds)
        self.busy = True
        self.busy_s += seconds
        self.steps += 1
        self.sim.sample_queues(self)
        self.sim.events.at(now + seconds, self._step_done, planned, prefill_chunk)

    def _beside_prefill(self, now: float, seconds: float) -> float:
        """The step's duration beside a prefill running on the same machine: the delay in proportion to the part of
        the step the prefill keeps running (all of it if more prefill is queued behind the running chunk)."""
        if seconds <= 0:
            return seconds
        extra = max((delay * min(1.0, (worker.runs_until - now) / seconds)
                     for worker, delay in self.sim.cohosted(self) if worker.busy), default=0.0)
        return seconds + extra

    def _take_local_prefill(self) -> list[tuple[_Req, int]]:
        budget, out = self.sim.cfg.prefill_chunk, []
        for req in self.local_prefill:
            if budget <= 0:
                break
            n = min(req.prefill_left, budget)
            if req.prefill_started is None:
                req.prefill_started = self.sim.events.now
            out.append((req, n))
            budget -= n
        return out

    def _step_done(self, planned, prefill_chunk) -> None:
        now = self.sim.events.now
        for rank, plan in planned:
            partial = set(plan.partial)
            for running in plan.decode:
                req = rank.reqs.get(running.request_id)
                if req is None:
                    continue
                self.sim.emit(req, now)
                self.sim.finish_if_done(req, rank, now)
            for window in plan.admitted:
                if window.request_id in partial:
                    continue
                req = rank.reqs[window.request_id]
                self.sim.emit_first(req, now)
                self.sim.finish_if_done(req, rank, now)
        for req, n in prefill_chunk:
            req.prefill_left -= n
            if req.prefill_left == 0:
                self.local_prefill.remove(req)
                req.prefill_done = now
                self.admit(req)
        self.busy = False
        self._step()


@dataclass(frozen=True)
class SimResult:
    """Per-request outcomes and the summary the planner and the report read."""

    summary: dict
    ttft_s: tuple[float, ...]
    itl_s: tuple[float, ...]
    token_times: dict[str, tuple[float, ...]]
    first_token_s: dict[str, float]


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


class Simulator:
    def __init__(self, cfg: ClusterConfig, record_token_times: bool = False, progress: bool = False) -> None:
        self.cfg, self.events = cfg, _Events()
        self.record_token_times, self.progress = record_token_times, progress
        self.decode = [_DecodeReplica(self, i) for i in range(cfg.decode_replicas)]
        self.prefill: list[_PrefillWorker] = []
        if cfg.mode is not Mode.COLOCATED:
            self.prefill = [_PrefillWorker(self, cfg.prefill_model, cfg.prefill_role, self._transfer)
                            for _ in range(cfg.prefill_replicas)]
        elif not cfg.colocated_prefill_in_step:
            for replica in self.decode:  # the CPU server's prefix thread, beside its decode loop
                replica.prefill_worker = _PrefillWorker(self, cfg.decode_model, Role.FULL, self._local_done(replica))
        self.reqs: dict[str, _Req] = {}
        self.done = 0
        self.queue_samples: list[int] = []
        self.prefill_queue_samples: list[int] = []
        self.stop_after: set[str] = set()

    # ---- request flow ---------------------------------------------------------------------------------------
    def _arrive(self, req: _Req) -> None:
        cfg = self.cfg
        if req.spec.prefix_ready or (cfg.mode is not Mode.COLOCATED and req.prefill_left == 0):
            replica = min(self.decode, key=_DecodeReplica.load)
            replica.admit(req)
            return
        if cfg.mode is Mode.COLOCATED:
            replica = min(self.decode, key=_DecodeReplica.load)
            if req.prefill_left == 0:
                replica.admit(req)
            elif replica.prefill_worker is not None:
                replica.prefill_worker.submit(req)
            else:
                replica.local_prefill.append(req)
                replica.kick()
            return
        worker = min(self.prefill, key=_PrefillWorker.queued_tokens)
        self.prefill_queue_samples.append(len(worker.queue))
        worker.submit(req)

    def cohosted(self, replica: _DecodeReplica) -> list[tuple[_PrefillWorker, float]]:
        """Prefill workers sharing `replica`'s machine, with the delay each puts on its decode steps."""
        out = []
        if replica.prefill_worker is not None and self.cfg.colocated_step_delay_s > 0:
            out.append((replica.prefill_worker, self.cfg.colocated_step_delay_s))
        if self.cfg.cohosted_step_delay_s > 0:
            out += [(w, self.cfg.cohosted_step_delay_s) for w in self.prefill]
        return out

    def _local_done(self, replica: _DecodeReplica) -> Callable[[_Req, float], None]:
        return lambda req, _share: replica.admit(req)

    def _transfer(self, req: _Req, last_chunk_share: float) -> None:
        nbytes = payload_bytes(self.cfg.mode, req.spec.prompt_tokens, self.cfg.model_cfg)
        compute = self.events.now - (req.prefill_started or self.events.now)
        delay = exposed_transfer_s(self.cfg.link, nbytes, compute, last_chunk_share)
        replica = min(self.decode, key=_DecodeReplica.load)
        self.events.at(self.events.now + delay, replica.admit, req)

    def emit_first(self, req: _Req, now: float) -> None:
        req.first_token = now
        req.last_token = now
        req.tokens = 1
        if req.times is not None:
            req.times.append(now)

    def emit(self, req: _Req, now: float) -> None:
        req.gaps.append(now - req.last_token)
        req.last_token = now
        req.tokens += 1
        if req.times is not None:
            req.times.append(now)

    def finish_if_done(self, req: _Req, rank: _Rank, now: float) -> None:
        """Frees `req`'s running slot once it has all its output tokens."""
        if req.tokens < req.spec.output_tokens:
            return
        rank.scheduler.finish(req.spec.rid)
        req.finished = now
        del rank.reqs[req.spec.rid]
        self.done += 1
        self.stop_after.discard(req.spec.rid)

    def sample_queues(self, replica: _DecodeReplica) -> None:
        self.queue_samples.append(sum(len(r.scheduler.waiting) + len(r.joins) for r in replica.ranks))

    # ---- run ------------------------------------------------------------------------------------------------
    def run(self, requests: Iterable[SimRequest], slo: Slo, stop_after: Iterable[str] | None = None,
            warmup_s: float = 0.0, until_s: float | None = None) -> SimResult:
        """Simulate until every request finished (or, with `stop_after`, until those did; or, with `until_s`, until
        that simulated time, leaving the rest unfinished)."""
        specs = sorted(requests, key=lambda r: r.arrival_s)
        if not specs:
            raise PlanInputError("the simulator needs at least one request")
        if len({s.rid for s in specs}) != len(specs):
            raise PlanInputError("request ids must be unique")
        for spec in specs:
            req = _Req(spec, 0 if spec.prefix_ready else self.cfg.prefill_tokens(spec.prompt_tokens))
            if self.record_token_times:
                req.times = array("d")
            self.reqs[spec.rid] = req
            self.events.at(spec.arrival_s, self._arrive, req)
        self.stop_after = set(stop_after) if stop_after is not None else set(self.reqs)
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(self.stop_after), desc=f"sim {self.cfg.mode.value}", unit="req", leave=False)
        last_left = len(self.stop_after)
        while self.events.heap and (self.stop_after or until_s is not None):
            if until_s is not None and self.events.heap[0][0] > until_s:
                break
            t, _, fn, args = heapq.heappop(self.events.heap)
            self.events.now = t
            fn(*args)
            if bar is not None and len(self.stop_after) != last_left:
                bar.update(last_left - len(self.stop_after))
                last_left = len(self.stop_after)
        if bar is not None:
            bar.close()
        if self.stop_after and until_s is None:
            raise RuntimeError(f"simulation ended with {len(self.stop_after)} requests unfinished (a deadlock)")
        return self._result(specs, slo, warmup_s)

    def _result(self, specs: list[SimRequest], slo: Slo, warmup_s: float) -> SimResult:
        measured = [self.reqs[s.rid] for s in specs if s.arrival_s >= warmup_s and self.reqs[s.rid].finished is not None]
        ttft = [r.first_token - r.spec.arrival_s for r in measured]
        gaps = [g for r in measured for g in r.gaps]
        good = [r for r in measured
                if r.first_token - r.spec.arrival_s <= slo.ttft_s and (not r.gaps or _pct(r.gaps, 99) <= slo.itl_s)]
        start = min(r.spec.arrival_s for r in measured) if measured else 0.0
        end = max(r.finished for r in measured) if measured else 0.0
        span = max(end - start, 1e-9)
        gpus = self.cfg.total_gpus
        out_tokens = sum(r.tokens for r in measured)
        summary = {
            "mode": self.cfg.mode.value, "requests": len(measured), "span_s": span, "gpus": gpus,
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99), "ttft_mean_s": float(np.mean(ttft)) if ttft else math.nan,
            "itl_p50_s": _pct(gaps, 50), "itl_p99_s": _pct(gaps, 99),
            "slo": {"ttft_s": slo.ttft_s, "itl_s": slo.itl_s},
            "slo_attainment": len(good) / len(measured) if measured else math.nan,
            "goodput_rps": len(good) / span, "goodput_rps_per_gpu": len(good) / span / gpus,
            "output_tokens_per_s": out_tokens / span, "output_tokens_per_s_per_gpu": out_tokens / span / gpus,
            "decode_queue_mean": float(np.mean(self.queue_samples)) if self.queue_samples else 0.0,
            "decode_queue_max": max(self.queue_samples, default=0),
            "prefill_queue_mean": float(np.mean(self.prefill_queue_samples)) if self.prefill_queue_samples else 0.0,
            "prefill_queue_max": max(self.prefill_queue_samples, default=0),
            "prefill_busy": (sum(w.busy_s for w in self.prefill) / (len(self.prefill) * span)) if self.prefill else None,
            "decode_busy": sum(d.busy_s for d in self.decode) / (len(self.decode) * span),
            "decode_steps": sum(d.steps for d in self.decode),
            "quantiles": {"q": list(QUANTILES), "ttft_s": [_pct(ttft, q) for q in QUANTILES],
                          "itl_s": [_pct(gaps, q) for q in QUANTILES]},
        }
        token_times = {rid: tuple(r.times) for rid, r in self.reqs.items() if r.times is not None}
        first = {rid: r.first_token for rid, r in self.reqs.items() if r.first_token is not None}
        return SimResult(summary, tuple(ttft), tuple(gaps), token_times, first)


def simulate(cfg: ClusterConfig, requests: Sequence[SimRequest], slo: Slo, progress: bool = False,
             warmup_s: float = 0.0) -> SimResult:
    """Run one simulation of `requests` on the cluster `cfg` and summarise it against `slo`."""
    return Simulator(cfg, progress=progress).run(requests, slo, warmup_s=warmup_s)


def check_rate(rate_rps: object) -> None:
    """Refuses a request rate that is not a finite number > 0 (the planner's and the simulator's input)."""
    if isinstance(rate_rps, bool) or not isinstance(rate_rps, (int, float)) or not math.isfinite(rate_rps) \
            or rate_rps <= 0:
        raise PlanInputError(f"request rate must be a finite number > 0 req/s, got {rate_rps!r}")


def poisson_requests(workload_pairs: Sequence[tuple[int, int]], rate_rps: float, seed: int) -> list[SimRequest]:
    """Requests with the given (prompt, output) lengths arriving as a Poisson process of `rate_rps`."""
    check_rate(rate_rps)
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for i, (prompt, output) in enumerate(workload_pairs):
        out.append(SimRequest(f"r{i}", t, prompt, output))
        t += float(rng.exponential(1 / rate_rps))
    return out
