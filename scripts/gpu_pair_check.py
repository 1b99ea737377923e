"""The asymmetric pair against SGLang's own colocated server, as a GPU user runs it (scripts/gpu_check.sh, step 4).

    python scripts/gpu_pair_check.py [--device cuda|cpu] [--lengths 1 127 128 129 1000 4097] [--out DIR]

A small random V4.1 checkpoint in the released layout (the `sglang-small` preset: 40 layers, SGLang's pool
geometry, release precision, 16,384 positions) is served twice with `python -m sglang.launch_server`: first by
SGLang's own colocated server with its defaults (on CUDA that includes decoder SWA bounded replay) but for one
prefill chunk of 8,192 tokens on every server (SGLang's forwards are not chunk-invariant bit for bit, and on CPU the
default 4,096-token chunk splits the window of N = 4,097), then by the pair,
`--disaggregation-mode asym-prefill` and `asym-decode`, behind sglang-router. The greedy tokens of each prompt length
are compared. Printed and written to DIR/pair_check.json: the table (length, equal, both token lists), each server's
memory (on CUDA the GPU memory nvidia-smi reports for its processes; on CPU the resident memory of its process tree)
and pass/fail. Exit 0 when every length gives the same tokens, 1 otherwise, 2 when a server does not start.
The device defaults to CUDA where torch sees it; `--device cpu` runs the same comparison on the CPU route.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "test"), str(ROOT / "benchmark")]  # the harness and the system tests' helpers
from harness.router_launch import RouterFlavor  # noqa: E402
from harness.server_process import ServerProcess, start_server  # noqa: E402
from process_memory import process_tree  # noqa: E402
from system.helpers import serving  # noqa: E402
from system.sglang_servers import SGLANG_ENV, greedy, patient_router, prompt_of, write_sglang_checkpoint  # noqa: E402

LENGTHS = (1, 127, 128, 129, 1000, 4097)
NEW_TOKENS = 8


PREFILL_CHUNK = 8192  # every prompt in one prefill forward on both sides: a chunk boundary inside a window rounds otherwise


def launch(mode: str, checkpoint: Path, logs: Path, device: str) -> ServerProcess:
    return start_server(mode, checkpoint, logs, "--device", device, "--enable-metrics", "--chunked-prefill-size",
                        str(PREFILL_CHUNK), module="sglang.launch_server", env=SGLANG_ENV)


def memory_mb(server: ServerProcess, device: str) -> float:
    """GPU memory of the server's processes (nvidia-smi) on CUDA, resident memory of its process tree on CPU."""
    pids = set(process_tree(server.proc.pid))
    if device == "cuda":
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return float(sum(int(mb) for pid, mb in (line.split(",") for line in out.splitlines() if line.strip())
                         if int(pid) in pids))
    total_kb = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            continue
        total_kb += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return round(total_kb / 1024, 1)


def greedy_all(url: str, lengths: list[int]) -> dict[int, list[int]]:
    return {n: greedy(url, prompt_of(n), NEW_TOKENS, ignore_eos=True) for n in lengths}


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu_check")))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.device == "cpu":  # two servers share the cores at a time: half of them each
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
    with tempfile.TemporaryDirectory(prefix="pair-check-") as tmp:
        checkpoint = write_sglang_checkpoint(Path(tmp) / "ckpt")
        logs = args.out / "pair_check_logs"
        logs.mkdir(exist_ok=True)
        print(f"[pair-check] SGLang's colocated server on {args.device}, its defaults", flush=True)
        try:
            with serving({"null": launch("null", checkpoint, logs, args.device)}, timeout_s=900) as servers:
                colocated = greedy_all(servers["null"].url, args.lengths)
                memory = {"colocated": memory_mb(servers["null"], args.device)}
            print("[pair-check] the pair: asym-prefill + asym-decode behind sglang-router", flush=True)
            pair_servers = {mode: launch(mode, checkpoint, logs, args.device) for mode in ("asym-prefill", "asym-decode")}
            with serving(pair_servers, timeout_s=900) as servers:
                with patient_router(servers["asym-prefill"], servers["asym-decode"], RouterFlavor.SGLANG_ROUTER) as router:
                    pair = greedy_all(router.url, args.lengths)
                memory.update({"prefill": memory_mb(servers["asym-prefill"], args.device),
                               "decode": memory_mb(servers["asym-decode"], args.device)})
        except RuntimeError as exc:  # a server that exits or never turns healthy (its log tail is in the message)
            print(f"[pair-check] a server did not start: {exc}", file=sys.stderr)
            return 2
    rows = [{"n": n, "equal": pair[n] == colocated[n], "pair": pair[n], "colocated": colocated[n]} for n in args.lengths]
    passed = all(row["equal"] for row in rows)
    print(f"{'N':>6}  {'equal':5}  pair / colocated greedy tokens")
    for row in rows:
        print(f"{row['n']:>6}  {'yes' if row['equal'] else 'NO':5}  {row['pair']} / {row['colocated']}")
    unit = "GPU MiB" if args.device == "cuda" else "RSS MiB"
    print(f"memory ({unit}): " + ", ".join(f"{k} {v}" for k, v in memory.items()))
    print(f"[pair-check] {'PASS' if passed else 'FAIL'}: {sum(r['equal'] for r in rows)} of {len(rows)} lengths equal")
    (args.out / "pair_check.json").write_text(json.dumps(
        {"command": "python scripts/gpu_pair_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
         "device": args.device, "lengths": rows, "memory_mib": memory, "memory_kind": unit, "passed": passed},
        indent=1) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
