"""Measure the reference model's step times on this CPU (small preset) and fit the planner's CPU step-time model.

Times `V41Model.forward_batch` (what the decode loop runs eagerly on CPU) for a grid of shapes
(d decode rows at context ctx, s window segments of w rows in all), and one-shot prefill forwards of the prefill-role model
and the full model for a few prompt lengths. Times are the measuring thread's CPU seconds (the cores are shared
with other work). Then fits, by least squares in relative terms:

  step_s = a + c_expert * E(d + w) + c_decode * d + c_window * s + r_window * w + b_ctx * d * ctx / 1000
  (E(T): expected distinct routed experts T rows select), on the step log of the real decode loop that
  benchmark/decode_itl.py recorded (--decode-log: every step it ran, 450 of them, every shape its two policies
  produce; the first step of each run, the first forward on fresh caches, left out), with the grid above as a
  cross-check ("grid_check": the grid's samples under that fit after one speed factor for the grid's occasion);
  prefill_s(n)   = p0 + p1 * n + p2 * n^2   (one fit per role: asym P, full model; chunks of 1024 as the servers)

and writes benchmark/results/plan_cpu_steptime.json (the samples, the fits, their residuals, the command).
`test/harness/cpu_step_model.py::CpuStepModel.from_json` reads it. Why the decode loop's log and not the grid: the
grid was timed on another occasion, when the shared cores ran window rows relatively dearer (its 4 x 128-row
window step predicts admit-all's 8 x 128-row burst step at 3.7 s; the loop ran it in 2.7 s), and the log is the
loop the servers run, at the shapes they run.

    nice -n 10 .venv/bin/python benchmark/plan_cpu_steptime.py [--reps 3] [--threads 1]   # measure and fit
    .venv/bin/python benchmark/plan_cpu_steptime.py --refit                              # refit the kept samples
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from sglang_asym.config import V41Config
from sglang_asym.model.model import SegmentInput
from sglang_asym.model.steps import prefill

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))  # the harness: the CPU step-time model
from harness.verify import Models, random_prompt  # noqa: E402
from harness.cpu_step_model import decode_loop_samples, fit_prefill, fit_step, speed_check  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# (decode rows, their context, window segments' rows): decode-only, window-only (one or several requests'
# windows), and mixed steps like the decode loop's (a running batch plus chunks of new windows).
SHAPES = (
    (1, 256, ()), (4, 256, ()), (8, 256, ()), (16, 256, ()), (1, 1024, ()), (8, 1024, ()),
    (0, 0, (8,)), (0, 0, (32,)), (0, 0, (128,)), (0, 0, (8, 8)), (0, 0, (128, 128, 128, 128)),
    (16, 256, (8,)), (16, 256, (32,)), (4, 1024, (32,)), (8, 256, (128, 128)), (16, 256, (7,)),
)
PREFILL_LENGTHS = (256, 512, 1024, 2048)
PREFILL_CHUNK = 1024  # the servers' --chunked-prefill-size default
WINDOW_PREFIX = 128  # window rows run over a 128-token prefix (a 256-token prompt's boundary)


def timed(fn) -> float:
    """CPU seconds of this thread (torch runs one intra-op thread here): other work on the shared cores does not
    count, as it would in wall-clock time."""
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


class Bench:
    """Caches at given contexts, and forwards of decode rows (1 token each) plus window chunks."""

    def __init__(self, models: Models, seed: int) -> None:
        self.models, self.cfg, self.seed = models, models.full.cfg, seed
        self.caches = models.full.new_cache_set()
        self.live: list = []

    def cache_at(self, ctx: int):
        cache = self.caches.new_request()
        prompt = random_prompt(self.cfg, ctx, seed=self.seed + len(self.live))
        for a in range(0, ctx, 512):
            self.models.full(prompt[a:a + 512], cache, logits="none")
        self.live.append(cache)
        return cache

    def release_all(self) -> None:
        for c in self.live:
            c.release()
        self.live = []

    def step(self, decode_caches, window_caches, window_rows) -> float:
        inputs = [SegmentInput(torch.tensor([5]), c, logits="all") for c in decode_caches]
        inputs += [SegmentInput(random_prompt(self.cfg, w, seed=7), c, logits="last")
                   for c, w in zip(window_caches, window_rows)]
        return timed(lambda: self.models.full.forward_batch(inputs))


def measure(models: Models, reps: int, seed: int, log) -> list[dict]:
    """Median of `reps` timed steps per shape, after one untimed step of the same shape (the first forward on a
    cache allocates its pages). Every step advances the caches it touches, as the decode loop's steps do."""
    samples = []
    bench = Bench(models, seed)
    for d, ctx, windows in SHAPES:
        decode = [bench.cache_at(ctx) for _ in range(d)]
        window = [bench.cache_at(WINDOW_PREFIX) for _ in windows]
        bench.step(decode, window, windows)
        times = [bench.step(decode, window, windows) for _ in range(reps)]
        samples.append({"decode_rows": d, "ctx": ctx, "window_segments": len(windows), "window_rows": sum(windows),
                        "seconds": statistics.median(times), "all": times})
        log(samples[-1])
        bench.release_all()
    return samples


def measure_prefill(models: Models, seed: int, log) -> list[dict]:
    out = []
    for role, model in (("prefill", models.prefill), ("full", models.full)):
        caches = model.new_cache_set()
        warm = caches.new_request()  # the first forward pays one-off initialisation
        prefill(model, warm, random_prompt(models.full.cfg, 64, seed=seed), logits="none")
        warm.release()
        for n in PREFILL_LENGTHS:
            cache = caches.new_request()
            tokens = random_prompt(models.full.cfg, n, seed=seed + n)
            seconds = timed(lambda: prefill(model, cache, tokens, chunk=PREFILL_CHUNK, logits="none"))
            cache.release()
            out.append({"role": role, "tokens": n, "seconds": seconds})
            log(out[-1])
    return out


def fits(grid: list[dict], prefills: list[dict], decode_log: Path) -> dict:
    cfg = V41Config.small()
    loop = decode_loop_samples(json.loads(decode_log.read_text()))
    step_fit = {**fit_step(loop, cfg.n_routed_experts, cfg.num_experts_per_tok), "source": str(decode_log.name)}
    return {"step_fit": step_fit, "grid_check": speed_check(step_fit, grid),
            "prefill_fit": {role: fit_prefill([p for p in prefills if p["role"] == role]) for role in ("prefill", "full")}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the servers run with 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_cpu_steptime.json")
    parser.add_argument("--refit", action="store_true", help="refit the samples already in --out (no measuring)")
    parser.add_argument("--decode-log", type=Path, default=RESULTS / "decode_itl.json",
                        help="decode_itl.py's result, whose step log the step terms are fitted on")
    args = parser.parse_args()
    if args.refit:
        result = json.loads(args.out.read_text())
        result.update(fits(result["step_samples"], result["prefill_samples"], args.decode_log))
        result["refit_command"] = "python " + " ".join(sys.argv)
        args.out.write_text(json.dumps(result, indent=1))
        print(json.dumps({k: result[k] for k in ("step_fit", "grid_check", "prefill_fit")}, indent=1))
        return 0
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    models = Models.build(V41Config.small(), args.seed, cache_quant="release")
    log = lambda s: print(json.dumps({k: v for k, v in s.items() if k != "all"}), flush=True)  # noqa: E731
    with torch.inference_mode():
        steps = measure(models, args.reps, args.seed, log)
        prefills = measure_prefill(models, args.seed, log)
    result = {
        "command": "python " + " ".join(sys.argv),
        "config": "small", "device": "cpu", "threads": args.threads, "reps": args.reps,
        "step_samples": steps, "prefill_samples": prefills, **fits(steps, prefills, args.decode_log),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("step_fit", "grid_check", "prefill_fit", "wall_s")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
