"""Where asymmetric PD beats SGLang's default symmetric PD (P with bounded replay), from the planner, over the
default grid of `python -m sglang_asym.plan compare`; writes benchmark/results/plan_compare.json and .png.

  PYTHONPATH=python python benchmark/plan_compare.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sglang_asym.plan.compare import CompareGrid, compare, plot_compare
from sglang_asym.plan.planner import PlanOptions

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    start = time.monotonic()
    report = compare(CompareGrid(), PlanOptions())
    report["wall_s"] = round(time.monotonic() - start, 1)
    (RESULTS / "plan_compare.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_compare(report, RESULTS / "plan_compare.png")
    for name, row in report["per_gpu"].items():
        print(f"{name:12s} asym wins {row['asym']:2d}  symmetric wins {row['symmetric']:2d}  ties {row['tie']:2d}  "
              f"neither {row['neither']:2d}  GPUs saved share {row['gpus_used_saved_share_range']}")
    print(f"{len(report['cells'])} cells in {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
