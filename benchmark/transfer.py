"""Transfer benchmark: asymmetric payload size vs symmetric PD, and the throughput of the
transfer layer vs a bare Mooncake batch write of the same bytes (same run, same entries).

    .venv/bin/python benchmark/transfer.py [--reps 5] [--out benchmark/results/transfer.json]

Spawns one prefill and one decode agent (one Mooncake engine each, TCP on 127.0.0.1). For each
prompt length N the prefill agent holds the rows of the asymmetric manifest (handed to
send_rows and finish(), as a finished prefill would), the decode agent creates a receiver,
and two intervals are taken from the managers' own time.monotonic() stamps (one host, so the
two processes share the clock):
- transfer phase (the headline ratio): from the moment P holds both the finished rows and D's
  destinations (D's handshake off P's socket, before P decodes it) to D's verified Success:
  P's decoding and checks of the handshake, the writes, P's completion with its CRCs, D's
  re-read CRC of every destination row, verdict. In a server D sends the handshake when the
  router hands it the request, while P is still computing the prefix, so the handshake is
  off the transfer's critical path.
- including the handshake: from D's create_receiver (slot allocation, the handshake's way to
  P) to the same verified Success.
P's CRCs start when send_rows hands the rows over, so here they overlap D's handshake.
The bare baselines then write exactly the same (src, dst, length) entries, to the same
registered pools, with the engine alone: Mooncake's batch_transfer_sync_write in calls of
<= 1024 entries (the goal's baseline), and the same entries submitted and polled the way the
transfer layer's engine wrapper does it (which shows the layer's own overhead).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path

from sglang_asym.config import V41Config
from sglang_asym.manifest import PayloadManifest
from sglang_asym.split import SplitPlan
from sglang_asym.transfer import RowFormat, TransferCompat, TransferConfig
from sglang_asym.transfer.loopback_rpc import AgentProcess

W = 128
LENGTHS = (512, 2048, 8192, 32768)
KV_ROW, INDEX_ROW, TAIL_ROW = 288, 68, 4096         # main-KV row, fp4 index-key row, fp32 pair tail
RATIO2_OWNERS, RATIO1_OWNERS = (2, 8, 14), (20,)
SWA_LAYERS, SWA_ROW = 40, 528
DSPARK_DRAFT_TOKENS = 3
PAIR_RING_ROWS = 1 << (DSPARK_DRAFT_TOKENS + 1).bit_length()  # SGLang's ratio-2 ring under spec decoding: 8
DRAFT_SWA_LAYERS, DRAFT_SWA_RING_ROWS = 1, 256                # ceil((128 + 3) / 256 pages) * 256 rows
ASSUMPTIONS = {
    "window": W,
    "asym": "per ratio-2 owner (L2, L8, L14): 288 B KV + 68 B index row per 2 prefix tokens; ratio-1 owner "
            "(L20): 288 + 68 B per prefix token; + one 4096 B pair tail per ratio-2 owner when B = N - W is odd",
    "symmetric": "compressed rows of the same 4 sources for all N tokens (no window floor) + 40 SWA layers x "
                 "min(N, 128) rows x 528 B + DSpark rings",
    "dspark_rings": f"{DSPARK_DRAFT_TOKENS} draft tokens: the 3 ratio-2 pending-pair rings of {PAIR_RING_ROWS} "
                    f"rows x 4096 B (shipped when N is odd, as SGLang ships the pair rings) + the draft "
                    f"model's SWA ring, {DRAFT_SWA_LAYERS} layer x {DRAFT_SWA_RING_ROWS} rows x 528 B (always)",
}


def asym_manifest(n_tokens: int, window: int = W) -> PayloadManifest:
    """The payload the servers move: SplitPlan's manifest for the Flash config at the release formats
    (semantics asym: the minimum, without the optional encoder window rows)."""
    return SplitPlan(V41Config.flash(), n_tokens, window, "asym").manifest("release").nonempty()


def minimum_asym_payload_bytes(n_tokens: int, window: int = W) -> int:
    """Bytes the asymmetric split must ship at minimum, from the per-token formula (independent
    of SplitPlan's manifest, which `asym_manifest` uses)."""
    b = max(0, n_tokens - window)
    per_pair = len(RATIO2_OWNERS) * (KV_ROW + INDEX_ROW)       # 3 x 356 B per 2 prefix tokens
    per_token = len(RATIO1_OWNERS) * (KV_ROW + INDEX_ROW)      # 356 B per prefix token
    return per_pair * (b // 2) + per_token * b + (len(RATIO2_OWNERS) * TAIL_ROW if b % 2 else 0)


def symmetric_payload_bytes(n_tokens: int) -> dict[str, int]:
    compressed = minimum_asym_payload_bytes(n_tokens + W) - (len(RATIO2_OWNERS) * TAIL_ROW if n_tokens % 2 else 0)
    parts = {
        "compressed_rows": compressed,
        "swa_rows": SWA_LAYERS * min(n_tokens, W) * SWA_ROW,
        "pair_rings": len(RATIO2_OWNERS) * PAIR_RING_ROWS * TAIL_ROW if n_tokens % 2 else 0,
        "draft_swa_ring": DRAFT_SWA_LAYERS * DRAFT_SWA_RING_ROWS * SWA_ROW,
    }
    parts["total"] = sum(parts.values())
    return parts


def run(reps: int) -> dict:
    formats = tuple(RowFormat(g.name, g.row_bytes, "raw") for g in asym_manifest(W + 3).groups)  # B = 3: all groups
    compat = TransferCompat("benchmark", formats, page_size=256, window=W, semantics="asym")
    capacity = max(LENGTHS)
    caps = {f.group: 64 if f.group.startswith("tail.") else capacity for f in formats}
    config = TransferConfig(peer_timeout_s=10.0, write_timeout_s=10)
    env = {"MC_LOG_LEVEL": "ERROR"}
    target = "sglang_asym.transfer.loopback_agents:"
    common = dict(env=env, config=config, compat=compat, capacities=caps, churn_block=128)  # 128-row runs
    prefill = AgentProcess(target + "PrefillAgent", **common)
    decode = AgentProcess(target + "DecodeAgent", **common)
    port = prefill.info["bootstrap_port"]
    decode.info  # noqa: B018 - both started in parallel
    results, room = {}, 1
    try:
        for n in (LENGTHS[0],) + LENGTHS:  # the first pass warms connections and caches; dropped
            manifest = asym_manifest(n)
            groups = [(g.name, g.row_bytes, g.num_rows) for g in manifest.groups]
            layer_s, full_s, bare_s, polled_s = [], [], [], []
            for rep in range(reps):
                room += 1
                prefill.call("start_sender", room=room, groups=groups, seed=rep)
                prefill.call("send_pipelined", room=room, chunk_rows=1 << 30)   # rows ready before D asks
                decode.call("start_receiver", room=room, groups=groups, bootstrap_port=port, return_slots=False)
                state, seconds, success_at = decode.call("seconds_to_outcome", room=room)
                assert state == 4, decode.call("wait", room=room, states=[0, 4])
                if rep == 0:
                    assert decode.call("verify", room=room, seed=rep)["mismatched_groups"] == []
                full_s.append(seconds)
                layer_s.append(success_at - prefill.call("transfer_phase_start", room=room))
                bare_s.append(prefill.call("bare_write", room=room, engine_call="batch_sync"))
                polled_s.append(prefill.call("bare_write", room=room, engine_call="polled"))
                prefill.call("wait", room=room, states=[0, 4])
                decode.call("release", room=room)
                prefill.call("release", room=room)
            sym = symmetric_payload_bytes(n)
            minimum = minimum_asym_payload_bytes(n)
            layer, full = statistics.median(layer_s), statistics.median(full_s)
            bare, polled = statistics.median(bare_s), statistics.median(polled_s)
            results[str(n)] = {
                "prefix_tokens_B": n - W,
                "asym_payload_bytes": manifest.total_bytes,
                "minimum_asym_payload_bytes": minimum,
                "payload_equals_minimum": manifest.total_bytes == minimum,
                "symmetric_payload_bytes": sym["total"],
                "symmetric_breakdown": sym,
                "symmetric_over_asym": round(sym["total"] / manifest.total_bytes, 3),
                "layer_seconds_median": layer,
                "layer_incl_handshake_seconds_median": full,
                "bare_engine_seconds_median": bare,
                "layer_gbps": round(manifest.total_bytes / layer / 1e9, 4),
                "layer_incl_handshake_gbps": round(manifest.total_bytes / full / 1e9, 4),
                "bare_engine_gbps": round(manifest.total_bytes / bare / 1e9, 4),
                "throughput_ratio_vs_bare_engine": round(bare / layer, 4),
                "throughput_ratio_vs_bare_engine_incl_handshake": round(bare / full, 4),
                "bare_polled_write_seconds_median": polled,
                "throughput_ratio_vs_bare_polled_write": round(polled / layer, 4),
                "layer_seconds": [round(x, 6) for x in layer_s],
                "layer_incl_handshake_seconds": [round(x, 6) for x in full_s],
                "bare_engine_seconds": [round(x, 6) for x in bare_s],
                "bare_polled_write_seconds": [round(x, 6) for x in polled_s],
                "reps": reps,
            }
    finally:
        prefill.stop()
        decode.stop()
    return results


def _interpreter() -> str:
    rel = os.path.relpath(sys.executable)
    return Path(sys.executable).name if rel.startswith("..") else rel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default="benchmark/results/transfer.json")
    args = parser.parse_args()
    per_n = run(args.reps)
    report = {
        "command": " ".join(shlex.quote(a) for a in [_interpreter(), *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other jobs (load average "
                   f"{os.getloadavg()[0]:.1f} at the end), loopback TCP, mooncake-transfer-engine-non-cuda "
                   "0.3.13.post1: timings are noisy",
        "timing": "layer (layer_seconds*, throughput_ratio_vs_bare_engine, the headline) = the TRANSFER PHASE: "
                  "from the moment P holds both the finished rows and D's destinations (D's handshake message "
                  "off P's socket, before P decodes it; P's finish() came earlier here) to D's verified Success "
                  "(P's decoding and checks of the handshake, its writes, its completion with the CRCs, D's CRC "
                  "re-read of every destination row, verdict), from time.monotonic() stamps of the two managers "
                  "on one host. It leaves out D's slot allocation and the handshake's way to P, which a server "
                  "does while P still computes the prefix. layer_incl_handshake (layer_incl_handshake_seconds*, "
                  "throughput_ratio_vs_bare_engine_incl_handshake) = D's create_receiver -> the same verified "
                  "Success (slot allocation and handshake included). Rows handed to send_rows + finish on P "
                  "before D asks (P's CRCs start then). bare engine = Mooncake batch_transfer_sync_write of the "
                  "same coalesced entries to the same registered pools, calls of <= 1024 entries, in the same "
                  "run right after each layer rep; bare polled write = the same entries through the engine "
                  "wrapper's submit-and-poll write (what the layer calls), its ratio against the transfer "
                  "phase; medians over reps",
        "assumptions": ASSUMPTIONS,
        "per_n": per_n,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for n, row in per_n.items():
        print(f"N={n:>6}: asym {row['asym_payload_bytes']:>10} B (= minimum: {row['payload_equals_minimum']}), "
              f"symmetric {row['symmetric_payload_bytes']:>10} B ({row['symmetric_over_asym']}x); layer "
              f"{row['layer_gbps']:.3f} GB/s vs bare {row['bare_engine_gbps']:.3f} GB/s "
              f"(ratio {row['throughput_ratio_vs_bare_engine']}, incl. handshake "
              f"{row['throughput_ratio_vs_bare_engine_incl_handshake']}; vs bare polled write "
              f"{row['throughput_ratio_vs_bare_polled_write']})")


if __name__ == "__main__":
    main()
