"""Where D's window chunks run when a decode batch is about to run (decode/window_step.py): on the CPU route they
ride in that decode forward (the reference forward runs both); with SGLang's own forward (CUDA) they run as an
EXTEND forward of their own, and that path never imports the CPU route's reference forward.

Each case runs `around_get_next_decode_batch` in a fresh interpreter (a clean sys.modules) with SGLANG_PLATFORM
choosing the platform, the window step's planning and forwards replaced by recorders: no model, no SGLang."""

import json
import subprocess
import sys

from .conftest import REPO

CASE = r"""
import json, sys
from types import SimpleNamespace
import sglang_asym.sglang_plugin.decode.window_step as ws
from sglang_asym.sglang_plugin.shared.settings import AsymSettings

calls = []
ws._settings = lambda: AsymSettings("asym-decode")
ws.recompute_fallback_prefixes = lambda scheduler: calls.append("recompute_fallback_prefixes")
ws.plan_window_step = lambda scheduler, decoding, settings: SimpleNamespace(chunks=("chunk",), step=1)
idle = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: True), batch_size=0, input_ids=None, positions=None)
ws.window_forward_batch = lambda scheduler, chunks: calls.append("window_forward_batch") or idle
ws.run_window_chunks = lambda scheduler, chunks: calls.append("run_window_chunks") or "samples"
ws.finish_step = lambda step, samples: calls.append("finish_step") or 0
decode = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: True), reqs=["running request"])
plan = SimpleNamespace(batch_to_run=decode, running_batch=decode)
scheduler = SimpleNamespace(spec_algorithm=SimpleNamespace(is_none=lambda: True))
returned = ws.around_get_next_decode_batch(lambda *args, **kwargs: plan, scheduler, decode)
name = "sglang_asym.sglang_plugin.cpu_platform.reference_forward"
riders = len(sys.modules[name].RECORDS.riders) if name in sys.modules else None
print(json.dumps({"calls": calls, "same_plan": returned is plan, "reference_forward_imported": name in sys.modules,
                  "queued_riders": riders}))
"""


def _run(platform: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "SGLANG_PLATFORM": platform, "PYTHONPATH": str(REPO / "python")}
    done = subprocess.run([sys.executable, "-c", CASE], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_on_sglangs_own_forward_the_chunks_run_alone_without_the_reference_forward():
    assert _run("cuda") == {"calls": ["recompute_fallback_prefixes", "run_window_chunks", "finish_step"],
                              "same_plan": True, "reference_forward_imported": False, "queued_riders": None}


def test_on_the_cpu_route_the_chunks_ride_in_the_decode_forward():
    assert _run("sglang_asym") == {"calls": ["recompute_fallback_prefixes", "window_forward_batch"],
                                   "same_plan": True, "reference_forward_imported": True, "queued_riders": 1}
