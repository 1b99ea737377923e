"""The CPU step-time model: least-squares fits of the reference model's step and prefill times measured on this machine.

    step_s(d, ctx, s, w) = a + c_expert * E(d + w) + c_decode * d + c_window * s + r_window * w + b_ctx * d * ctx / 1000
    prefill_s(n)       = p0 + p1 * n + p2 * n^2, one fit per role (asym P = layers 0-20's path; full model)

d decode rows (one token each) at mean context ctx, s window segments (new requests' window chunks) of w rows
in all. On a CPU every row costs compute (no bandwidth-bound regime), so a step is linear in its rows; each
request in a step also pays its own attention, compressor and indexer calls (c_decode, c_window), and every
routed expert the step's rows select is one more expert call: E(T) = experts * (1 - (1 - k / experts)^T) is the
expected number of distinct experts T rows touch (the same occupancy the GPU model uses for expert reads).

The step terms are fitted on the step log of the project's real decode loop (`decode_loop_samples`: every
step benchmark/decode_itl.py's loop ran, its rows and seconds); a grid of `forward_batch` shapes timed
separately on another occasion is kept as a cross-check (`grid_check`: its samples under the fit, after one
speed factor for that occasion, since the shared cores run at a different speed from one hour to the next).
The prefill terms are fitted on one-shot prefills of each role. benchmark/plan_cpu_steptime.py writes both
(benchmark/results/plan_cpu_steptime.json), with every coefficient >= 0.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.steptime import Role, StepTimeModel

STEP_TERMS = ("a", "c_expert", "c_decode", "c_window", "r_window", "b_ctx")
PREFILL_TERMS = ("p0", "p1", "p2")


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a time cannot shrink with more work), exactly: the best of
    the unconstrained fits over every subset of the terms whose coefficients all come out >= 0 (few terms)."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(b * b))
    for subset in itertools.product((False, True), repeat=a.shape[1]):
        cols = [i for i, keep in enumerate(subset) if keep]
        if not cols:
            continue
        coef, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if np.any(coef < 0):
            continue
        err = float(np.sum((a[:, cols] @ coef - b) ** 2))
        if err < best_err - 1e-15:
            best, best_err = np.zeros(a.shape[1]), err
            best[cols] = coef
    return best


def _lstsq(rows: list[list[float]], y: list[float], names: Sequence[str]) -> dict:
    """Minimise the squared RELATIVE residuals: timing noise is proportional to the time, and a 100 ms decode step
    matters as much to ITL as a 2 s window step does to TTFT (an absolute fit would serve the long steps only)."""
    a, b = np.asarray(rows, dtype=float), np.asarray(y, dtype=float)
    if a.shape[0] < a.shape[1]:
        raise PlanInputError(f"a fit of {len(names)} terms needs at least {len(names)} samples, got {a.shape[0]}")
    if np.any(b <= 0):
        raise PlanInputError("every timed sample must be > 0 seconds")
    coef = _nonnegative_lstsq(a / b[:, None], np.ones_like(b))
    pred = a @ coef
    rel = np.abs(pred - b) / b
    return {**{n: float(c) for n, c in zip(names, coef)}, "max_rel_residual": float(rel.max()),
            "mean_rel_residual": float(rel.mean()), "samples": int(a.shape[0])}


def experts_touched(rows: int, experts: int, top_k: int) -> float:
    """Expected distinct routed experts that `rows` tokens select, k of E each, uniformly."""
    return experts * (1 - (1 - top_k / experts) ** rows)


def fit_step(samples: Sequence[dict], experts: int, top_k: int) -> dict:
    """Fit step_s from samples {decode_rows, ctx, window_segments, window_rows, seconds}."""
    rows = [[1.0, experts_touched(s["decode_rows"] + s["window_rows"], experts, top_k), s["decode_rows"],
             s["window_segments"], s["window_rows"], s["decode_rows"] * s["ctx"] / 1000] for s in samples]
    return {**_lstsq(rows, [s["seconds"] for s in samples], STEP_TERMS), "experts": experts, "top_k": top_k}


def decode_loop_samples(decode_itl: dict) -> list[dict]:
    """Step samples from benchmark/decode_itl.json's step log (each policy's run of the real decode loop).

    Each run's first step is left out: it is the first forward on fresh caches (admit-all's runs 16 whole
    windows at once and allocates every page they need; 5.8 s where its shape otherwise costs about half).
    A step's decode rows are the running requests' next tokens; their mean context is the prompt plus the
    tokens the running requests decoded before this step (every decode row of the run so far) over the
    step's decode rows. Admit-all's window rows are whole 128-row windows (one segment each); the budget
    policy runs one request's chunk per step (one segment)."""
    out = []
    prompt, window = decode_itl["prompt_len"], decode_itl["window_rows_per_request"]
    for run in decode_itl["policies"]:
        decoded = 0
        for i, step in enumerate(run["steps"]):
            d, w = step["decode_rows"], step["window_rows"]
            if i > 0:
                segments = 0 if w == 0 else (-(-w // window) if run["window_chunk"] is None else 1)
                out.append({"decode_rows": d, "ctx": prompt + (decoded / d if d else 0), "window_segments": segments,
                            "window_rows": w, "seconds": step["seconds"], "policy": run["policy"]})
            decoded += d
    return out


def speed_check(fit: dict, samples: Sequence[dict]) -> dict:
    """How another occasion's step samples sit under `fit`: the one speed factor (their seconds over the fit's,
    least squares in relative terms) and the relative residuals left after it."""
    pred = np.array([_step_seconds(fit, s["decode_rows"], s["ctx"], s["window_segments"], s["window_rows"])
                     for s in samples])
    y = np.array([s["seconds"] for s in samples], dtype=float)
    r = pred / y
    k = float(np.sum(r) / np.sum(r * r))  # argmin_k sum(((k pred - y) / y)^2)
    rel = np.abs(k * pred - y) / y
    return {"seconds_over_fit": k, "max_rel_residual": float(rel.max()), "mean_rel_residual": float(rel.mean()),
            "samples": len(samples)}


def _step_seconds(fit: dict, d: int, ctx: float, s: int, w: int) -> float:
    return (fit["a"] + fit["c_expert"] * experts_touched(d + w, fit["experts"], fit["top_k"]) + fit["c_decode"] * d
            + fit["c_window"] * s + fit["r_window"] * w + fit["b_ctx"] * d * ctx / 1000)


def fit_prefill(samples: Sequence[dict]) -> dict:
    """Fit prefill_s from samples {tokens, seconds} of one role."""
    rows = [[1.0, s["tokens"], s["tokens"] ** 2] for s in samples]
    return _lstsq(rows, [s["seconds"] for s in samples], PREFILL_TERMS)


@dataclass(frozen=True)
class CpuStepModel(StepTimeModel):
    """Step times of the small preset on this CPU, one torch thread per server (what the benchmarks ran)."""

    a: float
    c_expert: float
    c_decode: float
    c_window: float
    r_window: float
    b_ctx: float
    prefill_p: tuple[float, float, float]  # asym P: layers 0-20's path
    prefill_full: tuple[float, float, float]  # the full model (symmetric P, colocated prefix)
    experts: int = 128  # the small preset's routed experts and experts per token
    top_k: int = 2
    name: str = "cpu-small"

    @classmethod
    def from_json(cls, path: str | Path) -> "CpuStepModel":
        data = json.loads(Path(path).read_text())
        s, p = data["step_fit"], data["prefill_fit"]
        return cls(*(s[k] for k in STEP_TERMS),
                   tuple(p["prefill"][k] for k in PREFILL_TERMS), tuple(p["full"][k] for k in PREFILL_TERMS),
                   experts=s["experts"], top_k=s["top_k"])

    def decode_step_s(self, decode_contexts: Sequence[int], window_chunks: Sequence[int] = ()) -> float:
        d, s, w = len(decode_contexts), len(window_chunks), sum(window_chunks)
        if d == 0 and s == 0:
            return 0.0
        t = self.a + self.c_expert * experts_touched(d + w, self.experts, self.top_k) + self.c_decode * d + self.c_window * s + self.r_window * w + self.b_ctx * sum(decode_contexts) / 1000
        return max(t, 0.0)

    def prefill_s(self, tokens: int, role: Role, context: int = 0) -> float:
        """Seconds to run `tokens` prompt tokens after `context` earlier ones (the quadratic term is attention's
        growth with the prefix, so a chunk at a context costs the difference of the two totals)."""
        if tokens <= 0:
            return 0.0
        p0, p1, p2 = self._coefficients(role)
        return max(p0 + self._growth(p1, p2, tokens, context), 0.0)

    def prefill_step_s(self, segments: Sequence[tuple[int, int]], role: Role) -> float:
        """Chunks of several prompts in one forward: one fixed cost, each chunk's own growth."""
        segments = [(n, c) for n, c in segments if n > 0]
        if not segments:
            return 0.0
        p0, p1, p2 = self._coefficients(role)
        return max(p0 + sum(self._growth(p1, p2, n, c) for n, c in segments), 0.0)

    def _coefficients(self, role: Role) -> tuple[float, float, float]:
        if role in (Role.SYM_P, Role.LATE):  # the CPU servers never ran bounded replay: no fit to answer with
            raise PlanInputError(f"the CPU step-time fit has no {role.value} prefill (measured: asym P and full model)")
        return self.prefill_p if role in (Role.ASYM_P, Role.RFC_P) else self.prefill_full

    @staticmethod
    def _growth(p1: float, p2: float, tokens: int, context: int) -> float:
        total = lambda n: p1 * n + p2 * n * n  # noqa: E731
        return total(context + tokens) - total(context)
