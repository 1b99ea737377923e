"""The asymmetric pair served by SGLang's own engine on CPU in the `v4` pool layout behind sglang-router,
against the in-process reference model at `cache_quant="v4"` computing the pair's pieces.

Per prompt length: the pair's and the reference's greedy tokens (equal or not), and the bytes P's exact-payload manager wrote
(`sglang_asym:kv_transfer_payload_bytes_total` on P's /metrics) against the SplitPlan manifest in the `v4`
row format. Afterwards SGLang's used-token counters of P and D. The suite checks `v41` this way
(test_cpu_sglang_engine_asym.py) and `v4` for `null` and symmetric PD (test_cpu_sglang_engine_v4.py); this
run covers the asymmetric modes in `v4` without adding two servers to the suite.
Writes benchmark/results/sglang_engine_v4_asym.json (one entry per semantics).

    .venv/bin/python benchmark/sglang_engine_v4_asym.py [--lengths 1 64 128 129 257 1000 4097]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from sglang_asym.model.loading import model_from_checkpoint
from sglang_asym.split import SplitPlan
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))  # test/harness/
from harness.sglang_shapes import sglang_small  # noqa: E402
from harness.pair_reference import pair_greedy  # noqa: E402
from harness.router_launch import RouterFlavor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD_BYTES = "sglang_asym:kv_transfer_payload_bytes_total"
WINDOW = 128
PREFILL_CHUNK = 8192  # P computes each prefix in one forward; the reference runs it the same way


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1, 64, 128, 129, 257, 1000, 4097])
    ap.add_argument("--semantics", default="asym-exact-encoder", choices=["asym-exact-encoder", "asym"])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmark" / "results" / "sglang_engine_v4_asym.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # each server its share of the cores (inherited)
    from system.helpers import serving
    from system.sglang_servers import (NEW_TOKENS, greedy, metric_sum, patient_router, prompt_of, settle,
                                       sglang_server, write_sglang_checkpoint)

    rows = []
    with tempfile.TemporaryDirectory(prefix="v4-asym-") as tmp:
        checkpoint = write_sglang_checkpoint(Path(tmp) / "ckpt")
        logs = Path(tmp) / "logs"
        logs.mkdir()
        flags = ("--asym-semantics", args.semantics, "--chunked-prefill-size", str(PREFILL_CHUNK))
        v4 = {"SGLANG_DSV4_KV_LAYOUT": "v4"}
        servers = {
            "prefill": sglang_server("asym-prefill", checkpoint, logs, *flags, env=v4),
            "decode": sglang_server("asym-decode", checkpoint, logs, *flags, env=v4),
        }
        reference = model_from_checkpoint(checkpoint, cache_quant="v4")  # the v4 pool's row formats
        with serving(servers, timeout_s=600):
            with patient_router(servers["prefill"], servers["decode"], RouterFlavor.SGLANG_ROUTER) as ours:
                for n in args.lengths:
                    before = metric_sum(servers["prefill"], PAYLOAD_BYTES) or 0.0
                    sglang_tokens = greedy(ours.url, prompt_of(n), ignore_eos=True)  # as many tokens as the reference
                    reference_tokens = pair_greedy(reference, list(prompt_of(n)), PREFILL_CHUNK, args.semantics,
                                                   NEW_TOKENS)
                    shipped = int((metric_sum(servers["prefill"], PAYLOAD_BYTES) or 0.0) - before)
                    manifest = SplitPlan(sglang_small(), n, WINDOW, args.semantics).manifest("v4").total_bytes
                    rows.append({"n": n, "equal": sglang_tokens == reference_tokens, "sglang_engine": sglang_tokens,
                                 "reference": reference_tokens, "payload_bytes": shipped, "manifest_v4_bytes": manifest})
                    print(json.dumps(rows[-1]), flush=True)
            used_after = settle([servers["prefill"], servers["decode"]])
    result = {"command": "python benchmark/sglang_engine_v4_asym.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "semantics": args.semantics, "layout": "v4", "lengths": rows,
              "all_equal": all(r["equal"] for r in rows),
              "payload_is_manifest": all(r["payload_bytes"] == r["manifest_v4_bytes"] for r in rows),
              "used_tokens_after": {"prefill": used_after[0], "decode": used_after[1]}}
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data[args.semantics] = result  # one entry per semantics
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("all_equal", "payload_is_manifest", "used_tokens_after")}))
    return 0 if result["all_equal"] and result["payload_is_manifest"] else 1


if __name__ == "__main__":
    sys.exit(main())
