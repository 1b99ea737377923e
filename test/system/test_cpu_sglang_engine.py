"""SGLang 0.5.23's own engine serving DeepSeek-V4.1 on CPU (`python -m sglang.launch_server --device cpu`), on
the nine-layer tiny checkpoint (every layer role: encoder layers 0-4, layer 5 the last KV source, decoder
layers 6-8; the 40-layer schedule is test_cpu_sglang_engine_asym.py's): its scheduler, PD queues, Mooncake KV
manager over TCP, tokenizer manager, detokenizer and HTTP server, with the project's reference forward over
SGLang's DeepSeekV4TokenToKVPool (cpu_platform.py).

Against the reference model computed in this process (decoder replay, the caches at the release formats
of SGLang's v41 pool, over exactly SGLang's chunks: the reference model is not chunk-invariant bit for bit):
- `null` with a chunked-prefill size above the prompt, and SGLang's symmetric `prefill` / `decode`
  over Mooncake behind sglang-router and smg, give the reference's greedy tokens for N in {1, 127, 128,
  129, 130, 600, 1500}, one request at a time, and after each of the pair's transfers D's pool holds P's
  rows byte for byte;
- P runs SGLang's default bounded replay (its forward log: the encoder and the last KV source's KV path on
  [0, B), every layer on [B, N) in 32-row chunks) and `null` the old full compute (SGLANG_ASYM_FULL_COMPUTE=1:
  every layer on [0, B)), with the same greedy tokens; for N <= 640 those are also an asym-exact-encoder
  pair's (the reference over P's 512-token chunks, as test_cpu_sglang_engine_asym.py holds its pair to);
- with a chunked-prefill size below the prompt, the reference over those chunks;
- 8 concurrent requests through the pair all complete; bad input gets a 400 and the servers keep
  serving; a kept-alive connection outlives SGLang's 5 s default; aborted requests, and requests SGLang
  retracts (its SGLANG_TEST_RETRACT switch, on D and on a colocated server), leave SGLang's own pool
  counters where they started.
One module-scoped set of four servers serves every case, the pair behind one module-scoped sglang-router.
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
from pathlib import Path

import pytest

from sglang_asym.layer_plan import LayerPlan
from sglang_asym.sglang_plugin.cpu_platform.replay_mode import FULL_COMPUTE_ENV
from sglang_asym.sglang_plugin.shared.pool_dump import FORWARD_LOG_ENV
from sglang_asym.sglang_plugin.shared.room_lifecycle import STOCK_ROOMS_NOTE
from harness.sglang_shapes import sglang_tiny
from harness.router_launch import RouterFlavor
from harness.server_process import post

from .helpers import serving

from .sglang_servers import (NEW_TOKENS, ONE_CHUNK, RETRACT_ENV, RETRACTED, DumpGroups, equal_pool_dumps, forward_log,
                             greedy, greedy_together, metric_sum, patient_router, prompt_of, reference_greedy_over_chunks,
                             reference_tokens, restore, settle, sglang_server)

pytestmark = pytest.mark.timeout(1500)

LENGTHS = (1, 127, 128, 129, 130, 600, 1500)
SMALL_CHUNK = 256  # --chunked-prefill-size below the longer prompts
WINDOW, WINDOW_CHUNK = 128, 32
PLAN = LayerPlan.from_config(sglang_tiny())
EARLY = list(range(PLAN.last_kv_source + 1))  # the encoder layers and the last KV source's KV path
EVERY = list(range(sglang_tiny().num_hidden_layers))
GROUPS = DumpGroups.of(sglang_tiny())
ABORTED_N = 2000  # a prompt the tiny model computes for over a second (a client's 1 s read timeout ends it first)
ASYM_PREFILL_CHUNK = 512  # the asym-exact-encoder pair's P chunk (test_cpu_sglang_engine_asym.py)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    """Where P and D dump each request's pool rows (pool_dump.py, a test aid)."""
    return tmp_path_factory.mktemp("pool_dumps")


@pytest.fixture(scope="module")
def engines(sglang_tiny_checkpoint, dumps, tmp_path_factory):
    logs = tmp_path_factory.mktemp("sglang_engine_logs")
    dump_env = {"SGLANG_ASYM_POOL_DUMP_DIR": str(dumps), FORWARD_LOG_ENV: str(logs / "prefill.jsonl")}
    servers = {
        # the labelled old baseline: every prompt row through every layer (bounded replay off)
        "null": sglang_server("null", sglang_tiny_checkpoint, logs,
                              env={FULL_COMPUTE_ENV: "1", FORWARD_LOG_ENV: str(logs / "null.jsonl")}),
        "null_small_chunks": sglang_server("null", sglang_tiny_checkpoint, logs, "--chunked-prefill-size",
                                           str(SMALL_CHUNK), env=RETRACT_ENV),
        "prefill": sglang_server("prefill", sglang_tiny_checkpoint, logs, env=dump_env),
        "decode": sglang_server("decode", sglang_tiny_checkpoint, logs, env={**dump_env, **RETRACT_ENV}),
    }
    with serving(servers, timeout_s=600):
        # one sglang-router in front of the pair for the module's cases (its own start costs seconds of CPU)
        with patient_router(servers["prefill"], servers["decode"], RouterFlavor.SGLANG_ROUTER) as router:
            servers.update(logs=logs, router=router)
            yield servers


@pytest.fixture(autouse=True)
def _shared_servers_back_to_empty(engines):
    """After each case: the module's servers healthy with empty pools, or restarted and the case failed."""
    yield
    restore(engines)


def _router(engines, flavor: RouterFlavor):
    """The module's sglang-router, or a router of `flavor` started for the case."""
    if flavor is RouterFlavor.SGLANG_ROUTER:
        return contextlib.nullcontext(engines["router"])
    return patient_router(engines["prefill"], engines["decode"], flavor)


def reference(checkpoint: Path, n: int) -> list[int]:
    """The reference's greedy tokens for prompt_of(n) in one chunk (cached: the null and both router tests
    compare against the same prompts)."""
    return reference_greedy_over_chunks(checkpoint, prompt_of(n), ONE_CHUNK)


def passes(n: int, room: int | None, bounded: bool) -> list[dict]:
    """The model passes of one prompt of N tokens in one extend forward (the forward log's `pieces`): [0, B) up to
    the last KV source's KV path (bounded replay) or through every layer (full compute), then [B, N) through every layer
    in the window's 32-row chunks."""
    boundary = max(n - WINDOW, 0)
    prefix = [{"layers": EARLY if bounded else EVERY, "rows": [[room, 0, boundary]]}] if boundary else []
    return prefix + [{"layers": EVERY, "rows": [[room, s, min(s + WINDOW_CHUNK, n)]]}
                     for s in range(boundary, n, WINDOW_CHUNK)]


def prompt_passes(path: Path) -> dict[int, list[list[dict]]]:
    """Each whole-prompt extend forward of one request in a forward log: its passes, by prompt length."""
    out: dict[int, list[list[dict]]] = {}
    for line in forward_log(path):
        if line["mode"] == "extend" and len(line["rows"]) == 1 and line["rows"][0][1] == 0:
            room, _, n = line["rows"][0]
            out.setdefault(n, []).append(line["pieces"])
            assert line["pieces"] == passes(n, room, bounded="null" not in path.name), line
    return out


@pytest.mark.parametrize("n", LENGTHS)
def test_null_equals_the_reference(engines, sglang_tiny_checkpoint, n):
    assert greedy(engines["null"].url, prompt_of(n)) == reference(sglang_tiny_checkpoint, n)
    assert n in prompt_passes(engines["logs"] / "null.jsonl")  # full compute: every layer on [0, B) too


@pytest.mark.parametrize("flavor, lengths", [(RouterFlavor.SGLANG_ROUTER, LENGTHS), (RouterFlavor.SMG, (1, 129, 600))],
                         ids=["sglang-router", "smg"])
def test_symmetric_pd_behind_the_router_equals_the_reference(engines, sglang_tiny_checkpoint, dumps, flavor, lengths):
    """Equal greedy tokens; and after each transfer, every row a later step reads (each layer's last-window
    rows, every compressed row and index key, the pending compressor token), read out of P's pool after
    its prefill and out of D's pool right after SGLang's Mooncake transfer committed the request, is the
    same at each side's own slots, byte for byte."""
    for old in dumps.glob("*.npz"):
        old.unlink()
    with _router(engines, flavor) as router:
        for n in lengths:
            got = greedy(router.url, prompt_of(n))
            assert got == reference(sglang_tiny_checkpoint, n), f"N={n}"
            if n <= ASYM_PREFILL_CHUNK + WINDOW:  # the asym pair's P computes [0, B) in one chunk too
                assert got == list(reference_tokens(sglang_tiny_checkpoint, tuple(prompt_of(n)), ASYM_PREFILL_CHUNK,
                                                    "release", "asym-exact-encoder")), f"N={n}"
    # P ran SGLang's bounded replay: the layers after the last KV source only on the last W rows of each prompt
    assert set(lengths) <= set(prompt_passes(engines["logs"] / "prefill.jsonl"))
    seen_lengths = []
    for n, p in equal_pool_dumps(dumps, len(lengths)):
        seen_lengths.append(n)
        assert (GROUPS.ratio2_tail in p) == (n % 2 == 1)
        assert p[GROUPS.last_window].shape == (min(n, 128), 528) and p[GROUPS.last_kv].shape == (n, 288)
        assert p[GROUPS.ratio2_kv].shape == (n // 2, 288) and p[GROUPS.ratio2_index].shape == (n // 2, 68)
        assert p[GROUPS.last_kv].any() and p["swa.L0"].any()  # real rows, not an empty pool
    assert sorted(seen_lengths) == sorted(lengths)


@pytest.mark.parametrize("n", (300, 600))
def test_chunks_below_the_prompt_equal_the_reference_over_the_same_chunks(engines, sglang_tiny_checkpoint, n):
    prompt = prompt_of(n)
    assert greedy(engines["null_small_chunks"].url, prompt) == \
        reference_greedy_over_chunks(sglang_tiny_checkpoint, prompt, SMALL_CHUNK)


def test_eight_concurrent_requests_through_the_pair_complete_through_retractions(engines):
    """8 concurrent requests through the pair all complete while D's SGLang retracts decoding requests (every
    third forward) and rebootstraps them through P in the same room (a V4 pool keeps no host copy). P, in
    SGLang's own prefill mode, runs SGLang's Mooncake classes with the plugin's room lifecycle: a handshake
    for a room's next lifecycle that comes before P cleared the previous one is kept (without it, one
    request waited out SGLang's 300 s and failed on the slowest CI host). Afterwards SGLang's used-token
    counters are back at zero on P and D."""
    pair = [engines["prefill"], engines["decode"]]
    assert STOCK_ROOMS_NOTE in engines["prefill"].log.read_text(errors="replace")
    retracted_before = metric_sum(engines["decode"], RETRACTED) or 0.0
    outputs = greedy_together(engines["router"].url, [prompt_of(n) for n in (5, 64, 129, 200, 257, 300, 400, 513)])
    assert [len(o) for o in outputs] == [NEW_TOKENS] * 8
    assert (metric_sum(engines["decode"], RETRACTED) or 0.0) > retracted_before
    assert settle(pair) == [0, 0]


def test_retracted_requests_complete_and_leave_the_pool_where_it_started(engines):
    """SGLang's retraction on a colocated server: retracted requests return to the waiting queue, their
    rows freed, and are computed again from their prompt and the tokens they had; all complete, and the
    used-token counter ends at zero."""
    server = engines["null_small_chunks"]
    assert settle([server]) == [0]
    retracted_before = metric_sum(server, RETRACTED) or 0.0
    outputs = greedy_together(server.url, [prompt_of(n) for n in (5, 40, 130, 200)])
    assert [len(o) for o in outputs] == [NEW_TOKENS] * 4
    assert (metric_sum(server, RETRACTED) or 0.0) > retracted_before
    assert settle([server]) == [0]


@pytest.mark.parametrize("body, message", [
    ({"input_ids": [5000, 6]}, "outside the model's vocabulary [0, 512)"),
    ({"input_ids": [-1, 6]}, "outside the model's vocabulary [0, 512)"),
    ({"input_ids": []}, "input_ids cannot be empty"),
    ({"input_ids": [5, 6], "sampling_params": {"temperature": -1}}, "temperature must be a non-negative"),
    ({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 20000}}, "maximum context length"),
])
def test_bad_input_gets_a_400_and_the_servers_keep_serving(engines, body, message):
    for server in ("null", "prefill"):
        status, resp = post(engines[server].url + "/generate", body)
        assert status == 400, resp
        assert message in resp["error"]["message"]
    assert len(greedy(engines["null"].url, prompt_of(3))) == NEW_TOKENS


def test_a_kept_alive_connection_outlives_sglangs_five_second_default(engines):
    """The routers reuse an idle connection for up to 90 s; SGLang's server closed it after 5 s, so a
    request sent on it right then failed in the router (502). The CPU platform keeps connections 120 s."""
    import http.client

    host, port = engines["null"].url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for wait_s in (0, 8):
            time.sleep(wait_s)
            conn.request("GET", "/get_model_info")
            resp = conn.getresponse()
            assert resp.status == 200 and b"model_path" in resp.read()
    finally:
        conn.close()


def test_aborted_requests_leave_the_pools_where_they_started(engines):
    """Clients that give up mid-request (a 1 s read timeout while the ABORTED_N-token prompt is still being computed)
    abort through SGLang, alone and through the pair; afterwards SGLang's own used-token counters are
    back at zero on every server, and each serves the next request."""
    pair = [engines["prefill"], engines["decode"]]
    assert settle([engines["null"], *pair]) == [0, 0, 0]
    body = {"input_ids": prompt_of(ABORTED_N), "sampling_params": {"max_new_tokens": 64, "temperature": 0}}
    for _ in range(3):
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            post(engines["null"].url + "/generate", body, timeout_s=1)
    for _ in range(3):
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            post(engines["router"].url + "/generate", body, timeout_s=1)
    assert settle([engines["null"], *pair]) == [0, 0, 0]
    assert len(greedy(engines["router"].url, prompt_of(3))) == NEW_TOKENS
    assert len(greedy(engines["null"].url, prompt_of(3))) == NEW_TOKENS
