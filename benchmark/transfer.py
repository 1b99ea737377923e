"""Transfer benchmark: asymmetric payload size vs symmetric PD, and the throughput of the
transfer layer vs a bare Mooncake batch write of the same rows (same run, same pools).

    .venv/bin/python benchmark/transfer.py [--reps 5] [--out benchmark/results/transfer.json]

Spawns two prefill/decode agent pairs (one Mooncake engine each, TCP on 127.0.0.1) with the same
pools and the same fragmented slot allocators: one STAGED (P's staging and D's landing buffer on,
as the servers run; transfer/extents.py), one DIRECT (both off: rows go slot run by slot run).
For each prompt length N, rep by rep and pair after pair, P holds the rows of the asymmetric
manifest (handed to send_rows and finish(), as a finished prefill would), D creates a receiver,
and two intervals are taken from the managers' own time.monotonic() stamps (one host, so the
processes share the clock):
- transfer phase (the headline): from the moment P holds both the finished rows and D's
  destinations (D's handshake off P's socket, before P decodes it) to D's verified Success:
  P's decoding and checks of the handshake, the writes, P's completion with its CRCs, D's CRC
  re-read of every row it got, verdict. In a server D sends the handshake when the router hands
  it the request, while P is still computing the prefix, so the handshake is off the critical
  path. P's CRCs (and a staged room's copy into its staging extent) happen when send_rows hands
  the rows over, as chunks finish, so they are not in it either.
- including the handshake: from D's create_receiver to the same verified Success.
The bare baselines are the engine alone moving the same rows from P's pool slots to D's pool
slots, exactly the entries the direct pair's layer wrote: Mooncake's batch_transfer_sync_write
in calls of <= 1024 entries, and the same entries submitted and polled as the engine wrapper
does; the headline ratio takes whichever of the two was faster (its median). Also reported: the
direct layer against the same baseline, and the staged layer against a bare write of its own
wire entries (staging extent -> landing extent), which isolates the layer's control overhead.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))  # test support: the loopback harness
from support.loopback_rpc import AgentProcess  # noqa: E402

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


STAGED_BYTES = 64 << 20  # landing zone on D and staging buffer on P (the largest payload here is 29 MB)


def _pair(config: TransferConfig, compat: TransferCompat, caps: dict[str, int]) -> tuple[AgentProcess, AgentProcess]:
    common = dict(env={"MC_LOG_LEVEL": "ERROR"}, config=config, compat=compat, capacities=caps,
                  churn_block=128)  # 128-row runs, the same slots in both pairs (same seeds)
    target = "support.loopback_agents:"
    return AgentProcess(target + "PrefillAgent", **common), AgentProcess(target + "DecodeAgent", **common)


def _one_transfer(P: AgentProcess, D: AgentProcess, room: int, groups, seed: int, check: bool) -> tuple[float, float]:
    """(transfer phase, create_receiver -> Success) seconds of one room, rows handed over before D asks."""
    P.call("start_sender", room=room, groups=groups, seed=seed)
    P.call("send_pipelined", room=room, chunk_rows=1 << 30)   # rows ready before D asks
    D.call("start_receiver", room=room, groups=groups, bootstrap_port=P.info["bootstrap_port"], return_slots=False)
    state, seconds, success_at = D.call("seconds_to_outcome", room=room)
    assert state == 4, D.call("wait", room=room, states=[0, 4])
    if check:
        assert D.call("verify", room=room, seed=seed)["mismatched_groups"] == []
    return success_at - P.call("transfer_phase_start", room=room), seconds


def _finish(P: AgentProcess, D: AgentProcess, room: int) -> None:
    P.call("wait", room=room, states=[0, 4])
    D.call("release", room=room)
    P.call("release", room=room)


def run(reps: int) -> dict:
    formats = tuple(RowFormat(g.name, g.row_bytes, "raw") for g in asym_manifest(W + 3).groups)  # B = 3: all groups
    compat = TransferCompat("benchmark", formats, page_size=256, window=W, semantics="asym")
    capacity = max(LENGTHS)
    caps = {f.group: 64 if f.group.startswith("tail.") else capacity for f in formats}
    timeouts = dict(peer_timeout_s=10.0, write_timeout_s=10)
    pairs = {"staged": _pair(TransferConfig(**timeouts, landing_bytes=STAGED_BYTES, staging_bytes=STAGED_BYTES),
                             compat, caps),
             "direct": _pair(TransferConfig(**timeouts), compat, caps)}
    for P, D in pairs.values():
        P.info, D.info  # noqa: B018 - all four started in parallel
    results, room = {}, 1
    try:
        for n in (LENGTHS[0],) + LENGTHS:  # the first pass warms connections and caches; dropped
            manifest = asym_manifest(n)
            groups = [(g.name, g.row_bytes, g.num_rows) for g in manifest.groups]
            t = {k: [] for k in ("staged", "staged_full", "direct", "direct_full", "bare", "polled", "wire",
                                 "wire_polled")}
            entries = {}
            for rep in range(reps):  # the modes interleaved rep by rep: the machine's noise hits both
                for mode, (P, D) in pairs.items():
                    room += 1
                    phase, full = _one_transfer(P, D, room, groups, rep, check=rep == 0)
                    t[mode].append(phase)
                    t[mode + "_full"].append(full)
                    entries[mode] = P.call("entry_count", room=room)
                    if mode == "direct":  # the rows from P's slots to D's slots, by the engine alone
                        t["bare"].append(P.call("bare_write", room=room, engine_call="batch_sync"))
                        t["polled"].append(P.call("bare_write", room=room, engine_call="polled"))
                    else:  # the staged layer's own wire entries (staging buffer -> landing extent)
                        t["wire"].append(P.call("bare_write", room=room, engine_call="batch_sync"))
                        t["wire_polled"].append(P.call("bare_write", room=room, engine_call="polled"))
                    _finish(P, D, room)
            med = {k: statistics.median(v) for k, v in t.items()}
            bare = min(med["bare"], med["polled"])  # the faster way to drive the bare engine
            wire = min(med["wire"], med["wire_polled"])
            sym = symmetric_payload_bytes(n)
            minimum = minimum_asym_payload_bytes(n)
            gbps = {k: round(manifest.total_bytes / v / 1e9, 4) for k, v in med.items()}
            results[str(n)] = {
                "prefix_tokens_B": n - W,
                "asym_payload_bytes": manifest.total_bytes,
                "minimum_asym_payload_bytes": minimum,
                "payload_equals_minimum": manifest.total_bytes == minimum,
                "symmetric_payload_bytes": sym["total"],
                "symmetric_breakdown": sym,
                "symmetric_over_asym": round(sym["total"] / manifest.total_bytes, 3),
                "entries_slot_to_slot": entries["direct"],
                "entries_staged_wire": entries["staged"],
                "layer_seconds_median": med["staged"],
                "layer_incl_handshake_seconds_median": med["staged_full"],
                "bare_engine_seconds_median": med["bare"],
                "layer_gbps": gbps["staged"],
                "layer_incl_handshake_gbps": gbps["staged_full"],
                "bare_engine_gbps": round(manifest.total_bytes / bare / 1e9, 4),
                "bare_engine_faster_seconds_median": bare,
                "throughput_ratio_vs_bare_engine": round(bare / med["staged"], 4),
                "throughput_ratio_vs_bare_engine_incl_handshake": round(bare / med["staged_full"], 4),
                "throughput_ratio_vs_bare_sync_write": round(med["bare"] / med["staged"], 4),
                "bare_polled_write_seconds_median": med["polled"],
                "throughput_ratio_vs_bare_polled_write": round(med["polled"] / med["staged"], 4),
                "direct_layer_seconds_median": med["direct"],
                "direct_layer_gbps": gbps["direct"],
                "direct_throughput_ratio_vs_bare_engine": round(bare / med["direct"], 4),
                "staged_speedup_over_direct": round(med["direct"] / med["staged"], 4),
                "bare_wire_entries_seconds_median": wire,
                "throughput_ratio_vs_bare_wire_entries": round(wire / med["staged"], 4),
                **{f"{k}_seconds": [round(x, 6) for x in v] for k, v in t.items()},
                "reps": reps,
            }
    finally:
        for P, D in pairs.values():
            P.stop()
            D.stop()
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
        "timing": "layer (layer_seconds*, the staged pair: P's staging and D's landing buffer, as the servers "
                  "run) = the TRANSFER PHASE: from the moment P holds both the finished rows and D's destinations "
                  "(D's handshake off P's socket, before P decodes it; P's finish() came earlier here) to D's "
                  "verified Success (P's decoding and checks of the handshake, its writes, its completion with the "
                  "CRCs, D's CRC re-read of every row, verdict), from time.monotonic() stamps of the managers on "
                  "one host. layer_incl_handshake = D's create_receiver -> the same verified Success. Rows handed "
                  "to send_rows + finish on P before D asks (P's CRCs and the staged copy happen then). bare "
                  "engine = the rows moved from P's pool slots to D's pool slots by the engine alone: exactly "
                  "the entries the direct pair's layer wrote (runs of the fragmented slots), as Mooncake "
                  "batch_transfer_sync_write in calls of <= 1024 entries (bare_engine_seconds*) and as the engine "
                  "wrapper's submit-and-poll write (bare_polled_write_seconds*), right after each rep. "
                  "throughput_ratio_vs_bare_engine = the faster of those two medians / the layer's median. "
                  "direct_* = the direct pair's layer (rows slot run by slot run) against the same baseline. "
                  "bare_wire_entries = the faster of a bare sync and a bare polled write of the staged layer's own "
                  "wire entries (staging extent -> landing extent, wire_* lists), its ratio the layer's control "
                  "overhead. The modes run interleaved rep by rep",
        "assumptions": ASSUMPTIONS,
        "per_n": per_n,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for n, row in per_n.items():
        print(f"N={n:>6}: asym {row['asym_payload_bytes']:>10} B (= minimum: {row['payload_equals_minimum']}), "
              f"symmetric {row['symmetric_payload_bytes']:>10} B ({row['symmetric_over_asym']}x); layer "
              f"{row['layer_gbps']:.3f} GB/s in {row['entries_staged_wire']} entries vs bare engine "
              f"{row['bare_engine_gbps']:.3f} GB/s in {row['entries_slot_to_slot']} (ratio "
              f"{row['throughput_ratio_vs_bare_engine']}, incl. handshake "
              f"{row['throughput_ratio_vs_bare_engine_incl_handshake']}); direct layer ratio "
              f"{row['direct_throughput_ratio_vs_bare_engine']}; vs bare wire entries "
              f"{row['throughput_ratio_vs_bare_wire_entries']}")


if __name__ == "__main__":
    main()
