"""The asymmetric modes inside SGLang 0.5.23's own engine on CPU: `python -m sglang.launch_server --device cpu
--disaggregation-mode asym-prefill | asym-decode` behind sglang-router and smg, against the reference model
computed in this process with the same semantics over the pair's forwards (P's prefill chunks of [0, B), D's
window chunks of [B, N)); each semantics is one module-scoped pair, started after the other pair stopped.
The pairs serve the nine-layer tiny checkpoint (every layer role: encoder layers 0-4, layer 5 the last KV source,
decoder layers 6-8, window 128, SGLang's pool geometry); the 40-layer schedule's cut (layers 0-19 and layer 20's
KV path) runs through SGLang's own forward in test/sglang_plugin/test_prefill_reference_layers.py, and the split
over it in test/core/test_split.py.
- greedy outputs equal the reference's for prompts across the window boundary, one request at a time;
- P ran the encoder layers and the last KV source's KV path on [0, B) only, through SGLang's own layer loop with
  P's cut (asym-exact-encoder: in SGLang's 512-token prefill chunks), and no forward at all for N <= W; D ran
  every layer over [B, N) in window chunks of at most 32 rows (the reference forward's log, a test aid);
- D's pool holds exactly what P's pool holds of the transferred extent, byte for byte (pool dumps), and
  the bytes P wrote per request (its /metrics counter) are exactly the SplitPlan manifest's;
- a long window runs in chunks beside a running request that keeps decoding every step;
- 12 concurrent mixed requests (generate, completions, chat; streamed and not): with the deterministic
  flag, in test_cpu_sglang_engine_deterministic.py;
- aborted requests leave SGLang's own pool counters at zero on both workers;
- requests SGLang retracts on D (its SGLANG_TEST_RETRACT switch, on the `asym` pair's D) are
  rebootstrapped through P and complete, short ones too while P computes a long prompt.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import time
import urllib.error
from pathlib import Path

import pytest

from harness.router_launch import RouterFlavor
from harness.server_process import post
from sglang_asym.layer_plan import LayerPlan
from harness.sglang_shapes import sglang_tiny
from sglang_asym.split import SplitPlan

from .helpers import serving
from .reference_prefetch import ReferencePrefetch
from .sglang_servers import (NEW_TOKENS, RETRACT_ENV, RETRACTED, DumpGroups, equal_pool_dumps, greedy, greedy_together,
                             metric_sum, mooncake_regions, patient_router, prompt_of, reference_tokens, restore, settle,
                             sglang_server)

pytestmark = pytest.mark.timeout(1800)

WINDOW = 128
CHUNK = 32
EXACT, ASYM = "asym-exact-encoder", "asym"
LENGTHS = (1, 64, 127, 128, 129, 130, 255, 256, 257, 1000)  # both semantics
# one long prompt, for the pair whose P runs SGLang's chunked prefill (8 chunks of 512): the asym pair's P would
# run it as one forward, the path N = 1000 already takes there, at twice the suite's cost of any other length
LONG_LENGTHS = {EXACT: (4097,), ASYM: ()}
SMG_LENGTHS = (1, 129, 1000)


def sweep(semantics: str) -> tuple[int, ...]:
    """The prompt lengths the router case sends to the pair of `semantics`."""
    return LENGTHS + LONG_LENGTHS[semantics]


# the prompt lengths each case compares with the reference (the `references` fixture queues them at module start)
REFERENCE_LENGTHS = {"test_greedy_outputs_equal_the_reference_behind_sglang_router": sweep,
                     "test_greedy_outputs_equal_the_reference_behind_smg": lambda semantics: SMG_LENGTHS}
CFG = sglang_tiny()
PLAN = LayerPlan.from_config(CFG)
EARLY = list(range(PLAN.last_kv_source + 1))  # what P runs: the encoder layers and the last KV source's KV path
EVERY = list(range(CFG.num_hidden_layers))
GROUPS = DumpGroups.of(CFG)
# P's chunk per semantics: the asym-exact-encoder pair computes B > 512 in chunks (N = 1000 and 4097 run
# SGLang's chunked prefill on P); the asym pair, whose D retracts, computes each prefix in one forward (its
# tests read each lifecycle's prefix end from P's forwards)
PREFILL_CHUNK = {"asym-exact-encoder": 512, "asym": 4096}
PAYLOAD_BYTES = "sglang_asym:kv_transfer_payload_bytes_total"  # P's exact-payload manager (exact_payload.py)
SGLANG_TRANSFER_MB = "sglang:kv_transfer_total_mb_sum"  # SGLang's own per-request histogram (MiB)
# the long prompt P computes while the short ones retract: about 5 s of P's compute on an idle host (the tiny
# checkpoint, its 3872-token prefix in one forward: PREFILL_CHUNK), which each rebootstrap computes again
LONG_N = 4000
ABORTED_N = 2000  # a prompt the tiny model computes for over a second (a client's 1 s read timeout ends it first)
RUNNER_TOKENS = 96  # decodes while the late request's prefix (256 rows on P) and window (4 chunks on D) run


BOTH = pytest.mark.parametrize("pairs", [EXACT, ASYM], indirect=True)
# semantics-independent checks (scheduling, concurrency, the second router) run with one semantics
EXACT_ONLY = pytest.mark.parametrize("pairs", [EXACT], indirect=True)
ASYM_ONLY = pytest.mark.parametrize("pairs", [ASYM], indirect=True)  # its D retracts (RETRACT_ENV)


@pytest.fixture(scope="module")
def references(request, sglang_tiny_checkpoint):
    """The reference tokens of every (semantics, N) the module's selected cases compare with, queued in the order
    the cases run: a background thread computes them while the pairs start and answer (reference_prefetch.py)."""
    with ReferencePrefetch() as prefetch:
        for item in request.session.items:
            if item.module is request.module and item.originalname in REFERENCE_LENGTHS:
                semantics = item.callspec.params["pairs"]
                for n in REFERENCE_LENGTHS[item.originalname](semantics):
                    prefetch.submit((semantics, n), functools.partial(_reference, sglang_tiny_checkpoint, semantics, n))
        yield prefetch


@pytest.fixture(scope="module")
def pairs(request, sglang_tiny_checkpoint, tmp_path_factory, references):
    """SGLang's asym pair (pool dumps and forward logs on) for one semantics, behind sglang-router."""
    semantics = request.param
    work = tmp_path_factory.mktemp(f"asym_{semantics}")
    logs, dumps = work / "logs", work / "dumps"
    logs.mkdir()
    dumps.mkdir()
    # the reference computes P's prefix in the same chunks (the reference model is not chunk-invariant bit for bit)
    flags = ("--asym-semantics", semantics, "--chunked-prefill-size", str(PREFILL_CHUNK[semantics]))

    def aids(role: str) -> dict[str, str]:
        return {"SGLANG_ASYM_POOL_DUMP_DIR": str(dumps), "SGLANG_ASYM_FORWARD_LOG": str(work / f"{role}.jsonl")}

    servers = {
        "prefill": sglang_server("asym-prefill", sglang_tiny_checkpoint, logs, *flags, env=aids("prefill")),
        "decode": sglang_server("asym-decode", sglang_tiny_checkpoint, logs, *flags,
                                env={**aids("decode"), **(RETRACT_ENV if semantics == ASYM else {})}),
    }
    with serving(servers, timeout_s=600):
        # one sglang-router for the module's cases (its own start costs seconds of CPU); smg starts per case
        with patient_router(servers["prefill"], servers["decode"], RouterFlavor.SGLANG_ROUTER) as router:
            servers.update(semantics=semantics, work=work, dumps=dumps, checkpoint=sglang_tiny_checkpoint,
                           references=references, router=router)
            yield servers


@pytest.fixture(autouse=True)
def _shared_servers_back_to_empty(pairs):
    """After each case: the module's servers healthy with empty pools, or restarted and the case failed."""
    yield
    restore(pairs)


def _reference(checkpoint: Path, semantics: str, n: int) -> list[int]:
    """The reference's greedy tokens for prompt_of(n) as the pair of `semantics` computes them."""
    return list(reference_tokens(checkpoint, tuple(prompt_of(n)), PREFILL_CHUNK[semantics], "release", semantics))


def reference(pairs, n: int) -> list[int]:
    """_reference for the pair's semantics: computed beside the servers (the `references` fixture), waited for here."""
    semantics = pairs["semantics"]
    return pairs["references"].get((semantics, n), functools.partial(_reference, pairs["checkpoint"], semantics, n))


def _forwards(pairs, role: str) -> list[dict]:
    path = pairs["work"] / f"{role}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _forget_logs(pairs) -> None:
    for role in ("prefill", "decode"):
        (pairs["work"] / f"{role}.jsonl").unlink(missing_ok=True)
    for old in pairs["dumps"].glob("*.npz"):
        old.unlink()


@BOTH
def test_greedy_outputs_equal_the_reference_behind_sglang_router(pairs):
    """Equal greedy tokens for every length; what each role computed (the forward logs); and per request,
    the bytes on the wire and D's pool rows (the transfer checks below)."""
    _forget_logs(pairs)
    lengths = sweep(pairs["semantics"])
    shipped, reported = [], []
    for n in lengths:
        prompt = prompt_of(n)
        before = [metric_sum(pairs["prefill"], name) or 0.0 for name in (PAYLOAD_BYTES, SGLANG_TRANSFER_MB)]
        assert greedy(pairs["router"].url, prompt) == reference(pairs, n), f"N={n}"
        after = [metric_sum(pairs["prefill"], name) or 0.0 for name in (PAYLOAD_BYTES, SGLANG_TRANSFER_MB)]
        shipped.append(int(after[0] - before[0]))
        reported.append(round((after[1] - before[1]) * 2**20))
    _check_what_each_role_computed(pairs, lengths)
    _check_the_bytes_on_the_wire(pairs, lengths, shipped, reported)
    _check_d_holds_what_p_transferred(pairs, lengths)


def _check_what_each_role_computed(pairs, lengths) -> None:
    """P: the early layers (EARLY) over exactly [0, B) per request, nothing for N <= W. D: every layer over
    [B, N) in chunks on the 32-row grid from B, then one decode row per step."""
    p_rows: dict[int, list[tuple[int, int]]] = {}
    for forward in _forwards(pairs, "prefill"):
        assert forward["layers"] == EARLY, forward  # the last KV source's KV path counts as that layer
        assert forward["mode"] == "extend-cut", forward  # SGLang's own layer loop with P's cut (reference_layer.py)
        for room, start, end in forward["rows"]:
            if room:  # room 0 / None: the router's health checks run through SGLang's fake transfer
                p_rows.setdefault(room, []).append((start, end))
    d_window: dict[int, list[tuple[int, int]]] = {}
    for forward in _forwards(pairs, "decode"):
        assert forward["layers"] == EVERY, forward
        for room, start, end in forward["rows"][forward["decode_rows"]:]:  # the extend rows: window chunks
            if room:
                d_window.setdefault(room, []).append((start, end))
    prompts = {}
    for room, chunks in d_window.items():
        chunks.sort()
        first, n = chunks[0][0], chunks[-1][1]
        assert all(b == c for (_, b), (c, _) in zip(chunks, chunks[1:])), (room, chunks)  # contiguous
        assert all(e - s <= CHUNK for s, e in chunks), (room, chunks)
        assert first == max(n - WINDOW, 0), (room, chunks)
        prompts[room] = n
    assert sorted(prompts.values()) == sorted(lengths)
    for room, n in prompts.items():
        b = max(n - WINDOW, 0)
        if b == 0:
            assert room not in p_rows, f"P computed rows for a prompt of {n} <= W tokens"
        else:
            covered = sorted(p_rows[room])
            assert covered[0][0] == 0 and covered[-1][1] == b, (n, covered)
            assert all(x[1] == y[0] for x, y in zip(covered, covered[1:])), (n, covered)
            chunk = PREFILL_CHUNK[pairs["semantics"]]
            assert len(covered) == -(-b // chunk), (n, covered)  # SGLang's chunked prefill on P
    assert len(p_rows) == len([n for n in prompts.values() if n > WINDOW])


@EXACT_ONLY
def test_greedy_outputs_equal_the_reference_behind_smg(pairs):
    with patient_router(pairs["prefill"], pairs["decode"], RouterFlavor.SMG) as ours:
        for n in SMG_LENGTHS:
            assert greedy(ours.url, prompt_of(n)) == reference(pairs, n), f"N={n}"


def _check_the_bytes_on_the_wire(pairs, lengths, shipped: list[int], reported: list[int]) -> None:
    """Bytes on the wire per request: exactly the SplitPlan manifest (SGLang's own sender would move whole
    pages), by P's counter and by SGLang's own per-request transfer metric; nothing for N <= W."""
    manifest = [SplitPlan(CFG, n, WINDOW, pairs["semantics"]).manifest("release").total_bytes
                if n > WINDOW else 0 for n in lengths]
    assert shipped == manifest and reported == manifest


def _check_d_holds_what_p_transferred(pairs, lengths) -> None:
    """The transferred extent (compressed rows and index keys of [0, B), pending compressor tokens, and
    with asym-exact-encoder the encoder layers' last window rows) read out of P's pool after its forward
    and out of D's pool right after SGLang's Mooncake transfer committed the request, byte for byte."""
    prefixes = sorted(n - WINDOW for n in lengths if n > WINDOW)
    boundaries = []
    for b, p in equal_pool_dumps(pairs["dumps"], len(prefixes)):
        boundaries.append(b)
        swa = sorted(int(f.removeprefix("swa.L")) for f in p if f.startswith("swa."))
        assert swa == (list(PLAN.encoder_layers) if pairs["semantics"] == EXACT else [])
        assert all(p[f"swa.L{i}"].shape == (min(b, WINDOW - 1), 528) for i in swa)  # the manifest's W - 1 rows
        assert (GROUPS.ratio2_tail in p) == (b % 2 == 1)
        assert p[GROUPS.last_kv].shape == (b, 288) and p[GROUPS.ratio2_kv].shape == (b // 2, 288)
        assert p[GROUPS.last_kv].any()  # real rows, not an empty pool
    assert sorted(boundaries) == prefixes


@EXACT_ONLY
def test_a_window_runs_in_chunks_while_a_running_request_keeps_decoding(pairs):
    """A request decoding RUNNER_TOKENS tokens, then a 384-token prompt whose 128-row window runs in 4 chunks: each
    chunk rides in the running request's decode forward (a mixed step: one forward holds the decode row and the
    chunk), so the running request decodes in every step of the window, and no forward holds more than the
    budget (256 rows)."""
    _forget_logs(pairs)
    router = pairs["router"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runner = pool.submit(greedy, router.url, prompt_of(5), RUNNER_TOKENS, True)  # ignore_eos: it must keep decoding
        deadline = time.monotonic() + 300
        while not any(f["mode"] == "decode" for f in _forwards(pairs, "decode")) and time.monotonic() < deadline:
            time.sleep(0.2)  # the first request is decoding
        late = pool.submit(greedy, router.url, prompt_of(384))
        assert len(late.result()) == NEW_TOKENS and len(runner.result()) == RUNNER_TOKENS
    forwards = _forwards(pairs, "decode")
    runner_room = next(room for f in forwards if f["mode"] == "decode" for room, _, _ in f["rows"] if room)
    window_steps = [f for f in forwards if any(s >= 256 and e <= 384 for _, s, e in f["rows"][f["decode_rows"]:])]
    late_room = window_steps[0]["rows"][-1][0]
    assert late_room != runner_room
    assert [f["rows"][f["decode_rows"]:] for f in window_steps] == [[[late_room, s, s + 32]] for s in (256, 288, 320, 352)]
    for f in window_steps:
        assert f["mode"] == "mixed", f
        runner_rows = [(s, e) for room, s, e in f["rows"][:f["decode_rows"]] if room == runner_room]
        assert len(runner_rows) == 1 and runner_rows[0][1] == runner_rows[0][0] + 1, f  # its decode row
    assert max(sum(e - s for _, s, e in f["rows"]) for f in forwards) <= 256


@BOTH
def test_aborted_requests_leave_the_pools_where_they_started(pairs):
    """Clients that give up mid-request (a 1 s read timeout while P computes the prefix, or D the window or
    the decode steps of a prompt within the window)
    abort through SGLang on both workers; afterwards SGLang's own used-token counters are back at zero, each
    worker holds the Mooncake registrations it held before, and the pair serves the next request."""
    pair = [pairs["prefill"], pairs["decode"]]
    assert settle(pair) == [0, 0]
    regions = [mooncake_regions(server) for server in pair]
    assert min(regions) > 0, regions  # the pools, registered once at start-up
    router = pairs["router"]
    for n in (ABORTED_N, 120, ABORTED_N):
        body = {"input_ids": prompt_of(n), "sampling_params": {"max_new_tokens": 64, "temperature": 0}}
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            post(router.url + "/generate", body, timeout_s=1)
    assert settle(pair) == [0, 0]
    assert len(greedy(router.url, prompt_of(3))) == NEW_TOKENS
    assert len(greedy(router.url, prompt_of(300))) == NEW_TOKENS
    assert [mooncake_regions(server) for server in pair] == regions


def _retracted_together(pairs, lengths: tuple[int, ...], new_tokens: int) -> dict[int, list[int]]:
    """Sends `lengths` at once to the pair whose D retracts; every request completes whole, D retracted at
    least once, both pools end empty. Returns, per room, the prefix ends P computed (oldest first)."""
    _forget_logs(pairs)
    pair = [pairs["prefill"], pairs["decode"]]
    retracted_before = metric_sum(pairs["decode"], RETRACTED) or 0.0
    outputs = greedy_together(pairs["router"].url, [prompt_of(n) for n in lengths], new_tokens)
    assert [len(o) for o in outputs] == [new_tokens] * len(lengths)
    assert (metric_sum(pairs["decode"], RETRACTED) or 0.0) > retracted_before
    assert settle(pair) == [0, 0]
    ends: dict[int, list[int]] = {}
    for forward in _forwards(pairs, "prefill"):
        for room, _, end in forward["rows"]:
            if room:
                ends.setdefault(room, []).append(end)
    return ends


@ASYM_ONLY
def test_requests_d_retracts_are_rebootstrapped_and_complete(pairs):
    """SGLang retracts decoding requests on D. A V4 pool keeps no host copy, so SGLang rebootstraps each:
    P is asked again for the prompt and the output tokens but the last (one more forward over a prefix as
    long or longer, same room), D's window runs over the rest of that sequence, and the kept last token
    is replayed. Every request completes with all its tokens; SGLang's used-token counters end at zero."""
    lengths = (129, 200, 257, 300, 400, 513)  # short ones: the test below
    ends = _retracted_together(pairs, lengths, NEW_TOKENS)
    first = sorted(e[0] for e in ends.values())
    assert first == sorted(n - WINDOW for n in lengths if n > WINDOW)
    # a rebootstrapped request: P ran the same room again over B' = N + k - 1 - W after k output tokens
    again = [e for e in ends.values() if len(e) > 1]
    assert again, ends
    for e in again:
        assert e == sorted(e) and e[-1] - e[0] <= NEW_TOKENS - 1, ends


@ASYM_ONLY
def test_short_requests_retracted_while_p_computes_a_long_prompt_are_rebootstrapped(pairs):
    """Prompts of at most W run no forward on P, so P concludes their rooms at once and may then compute a
    long prompt for seconds before its scheduler clears those rooms; D meanwhile commits, decodes, retracts
    and sends the rebootstrap handshake for the same room. P keeps that handshake (room_lifecycle.py;
    before it, the late clear erased it and the request waited out SGLang's 300 s timeout, then failed).
    Every request completes; P ran a forward for the long prompt's room only; the pools end empty."""
    # the short ones stay <= W with every output token
    ends = _retracted_together(pairs, (64, LONG_N, 20, 100), 16)
    assert [e[0] for e in ends.values()] == [LONG_N - WINDOW], ends
