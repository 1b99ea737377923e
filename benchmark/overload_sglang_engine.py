"""Overload of the asym pair served by SGLang's own engine on CPU, behind sglang-router.

`python -m sglang.launch_server --device cpu --disaggregation-mode asym-prefill | asym-decode` on the small
checkpoint at SGLang's pool geometry, each worker admitting --max-running-requests + --max-queued-requests
requests for at most --asym-request-deadline-s (sglang_plugin/admission.py), with /health answering
liveness (sglang_plugin/liveness.py), behind sglang-router with the README's settings (default health
checks, no circuit breaker, no retries). Two phases, each followed by a wait for the pair to serve again:
  mixed  --mixed concurrent requests, prompts of 1-900 tokens, 4 new tokens each;
  burst  --burst requests at once.
Per phase: how many completed, were refused (503 from the admission bound, before any work) or aborted (503
at the deadline), any other outcome; the p50 / p99 / max seconds to a refusal and to an answer; after
the phase, the seconds until a new request completes and until SGLang's pool counters (sglang:num_used_tokens)
are 0 on both workers; /health latency on both workers during the mixed phase. Results go to
benchmark/results/overload.json, with the command.

    .venv/bin/python benchmark/overload_sglang_engine.py [--mixed 40 --burst 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))
from harness.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess  # noqa: E402
from harness.server_process import wait_healthy  # noqa: E402
from system.helpers import ids  # noqa: E402
from system.sglang_servers import sglang_server, used_tokens, write_sglang_checkpoint  # noqa: E402
from system.test_overload import HealthProbe, Outcome, mixed_prompts, send_all, serves_again  # noqa: E402


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def phase_summary(outcomes: list[Outcome], wall_s: float) -> dict:
    refusals = [o.seconds for o in outcomes if o.refused]
    answers = [o.seconds for o in outcomes]
    return {
        "requests": len(outcomes), "completed": sum(o.completed for o in outcomes),
        "refused": len(refusals), "aborted": sum(o.aborted for o in outcomes),
        "other": [(o.status, o.message[:200]) for o in outcomes if not (o.completed or o.refused or o.aborted)],
        "refusal_s": {"p50": quantile(refusals, 0.5), "p99": quantile(refusals, 0.99), "max": quantile(refusals, 1)},
        "answer_s": {"p50": quantile(answers, 0.5), "p99": quantile(answers, 0.99), "max": quantile(answers, 1)},
        "wall_s": round(wall_s, 2),
    }


def recovery(router_url: str, servers: list, bound_s: float) -> dict:
    """Seconds until a new request completes, then until both pools are empty."""
    start = time.monotonic()
    again = serves_again(router_url, bound_s)
    while any(used_tokens(s) for s in servers):
        if time.monotonic() - start > bound_s:
            raise AssertionError(f"pools not empty {bound_s} s after the load: {[used_tokens(s) for s in servers]}")
        time.sleep(0.2)
    return {"serves_again_s": round(again, 3), "pools_empty_s": round(time.monotonic() - start, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixed", type=int, default=40)
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--max-running-requests", type=int, default=2)
    ap.add_argument("--max-queued-requests", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=40.0, help="--asym-request-deadline-s of both workers")
    ap.add_argument("--recovery-bound", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmark" / "results" / "overload.json")
    args = ap.parse_args(argv)
    flags = ("--max-running-requests", str(args.max_running_requests), "--max-queued-requests",
             str(args.max_queued_requests), "--asym-request-deadline-s", f"{args.deadline:g}")
    result: dict = {"command": "python benchmark/overload_sglang_engine.py "
                    + " ".join(argv if argv is not None else sys.argv[1:]), "worker_flags": list(flags)}
    with tempfile.TemporaryDirectory(prefix="overload-") as tmp:
        checkpoint = write_sglang_checkpoint(Path(tmp) / "ckpt")
        logs = Path(tmp) / "logs"
        logs.mkdir()
        servers = [sglang_server("asym-prefill", checkpoint, logs, *flags),
                   sglang_server("asym-decode", checkpoint, logs, *flags)]
        router = None
        try:
            for s in servers:
                wait_healthy(s, timeout_s=600)
            router = RouterProcess(RouterConfig(
                prefill=(PrefillWorker(servers[0].url, servers[0].bootstrap_port),), decode=(servers[1].url,),
                flavor=RouterFlavor.SGLANG_ROUTER, retry_max_retries=1,
                extra_args=("--disable-circuit-breaker",)), log_path=logs / "router.log")
            router.start(ready_timeout_s=180)
            serves_again(router.url, args.recovery_bound)  # warm

            probe = HealthProbe([s.url for s in servers])
            poller = threading.Thread(target=probe.run, daemon=True)
            poller.start()
            start = time.monotonic()
            mixed = send_all(router.url, mixed_prompts(args.mixed, seed=1))
            result["mixed"] = phase_summary(mixed, time.monotonic() - start)
            probe.stop.set()
            poller.join()
            result["mixed"]["health_during"] = {
                "checks": len(probe.answers), "not_200": sum(status != 200 for status, _ in probe.answers),
                "max_s": quantile([s for _, s in probe.answers], 1)}
            result["mixed"]["after"] = recovery(router.url, servers, args.recovery_bound)

            start = time.monotonic()
            burst = send_all(router.url, [ids(1 + (i * 53) % 300, seed=5000 + i) for i in range(args.burst)])
            result["burst"] = phase_summary(burst, time.monotonic() - start)
            result["burst"]["after"] = recovery(router.url, servers, args.recovery_bound)
        finally:
            if router is not None:
                router.stop()
            for s in servers:
                s.stop()
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
