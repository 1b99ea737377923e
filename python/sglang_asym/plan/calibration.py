"""Efficiencies measured on a GPU, read by the planner in place of its assumed MBU / MFU.

The file is JSON (scripts/gpu_check.sh writes it on a lent GPU with `write_calibration`):

  {"schema": "sglang-asym.plan.calibration/1",
   "gpus": {"H200": {"mbu": 0.64,              achieved fraction of peak HBM bandwidth in decode steps, (0, 1]
                     "mfu": 0.41,              achieved fraction of dense tensor FLOP/s in prefill GEMMs, (0, 1]
                     "step_overhead_s": 0.002,     optional: fixed seconds per decode step (default 0.002)
                     "prefill_overhead_s": 0.005,  optional: fixed seconds per prefill forward (default 0.005)
                     "measured": "what ran, where and when"}}}

A GPU the file does not name (or no file) keeps the assumed defaults, and the plan says so in its "efficiency"
entry. The file is looked up at the path given, else $SGLANG_ASYM_PLAN_CALIBRATION, else plan/calibration.json
beside this module.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import PlanInputError
from .gpu_model import Efficiency

SCHEMA = "sglang-asym.plan.calibration/1"
ENV = "SGLANG_ASYM_PLAN_CALIBRATION"
DEFAULT_PATH = Path(__file__).with_name("calibration.json")
_REQUIRED = ("mbu", "mfu")
_OPTIONAL = ("step_overhead_s", "prefill_overhead_s")


@dataclass(frozen=True)
class Calibrated:
    """The efficiencies a plan uses for one GPU and where they come from."""

    efficiency: Efficiency
    source: str  # the file, or "assumed" when no measurement names this GPU

    def as_dict(self) -> dict:
        return {**asdict(self.efficiency), "source": self.source}


def calibration_path(path: str | Path | None = None) -> Path:
    return Path(path) if path else Path(os.environ[ENV]) if os.environ.get(ENV) else DEFAULT_PATH


def load_efficiency(gpu_name: str, path: str | Path | None = None) -> Calibrated:
    """The calibrated efficiencies of `gpu_name`, or the assumed defaults when none were measured. A path given
    explicitly must exist; a malformed file is an error (never silently replaced by defaults)."""
    where = calibration_path(path)
    if not where.exists():
        if path:
            raise PlanInputError(f"calibration file {where} does not exist")
        return Calibrated(Efficiency(), f"assumed (no calibration file at {where})")
    try:
        data = json.loads(where.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanInputError(f"calibration file {where} is not readable JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("gpus"), dict):
        raise PlanInputError(f"calibration file {where}: expected {{'schema': {SCHEMA!r}, 'gpus': {{...}}}}")
    entry = data["gpus"].get(gpu_name)
    if entry is None:
        return Calibrated(Efficiency(), f"assumed ({where} has no entry for {gpu_name})")
    return Calibrated(_efficiency(entry, f"{where} [{gpu_name}]"), f"{where} [{gpu_name}]: {entry.get('measured', '')}")


def _efficiency(entry: object, where: str) -> Efficiency:
    if not isinstance(entry, dict) or any(k not in entry for k in _REQUIRED):
        raise PlanInputError(f"calibration {where}: needs numbers {list(_REQUIRED)}")
    values = {}
    for key in _REQUIRED + _OPTIONAL:
        if key in entry:
            v = entry[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise PlanInputError(f"calibration {where}: {key} must be a finite number, got {v!r}")
            values[key] = float(v)
    return Efficiency(**values)


def write_calibration(path: str | Path, gpu_name: str, efficiency: Efficiency, measured: str) -> Path:
    """Add or replace one GPU's measured efficiencies in the file (created when missing)."""
    where = Path(path)
    data = json.loads(where.read_text()) if where.exists() else {"schema": SCHEMA, "gpus": {}}
    if data.get("schema") != SCHEMA:
        raise PlanInputError(f"{where} is not a {SCHEMA} file")
    data["gpus"][gpu_name] = {**asdict(efficiency), "measured": measured}
    where.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return where
