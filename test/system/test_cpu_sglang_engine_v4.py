"""SGLang's own engine on CPU with the `v4` KV pool layout (SGLANG_DSV4_KV_LAYOUT=v4, what SGLang picks on
an H200), on the nine-layer tiny checkpoint (every layer role; the layout, not the 40-layer schedule, is the
subject): window and compressed KV rows of 448 fp8 nope + 64 bf16 rope channels (584 bytes), index keys
as in v41. The reference forward then quantizes its caches the same way, and so does the reference model
computed in this process (cache_quant v4):
- `null` with a chunked-prefill size of 256 gives the reference's greedy tokens over the same chunks;
- SGLang's symmetric `prefill` / `decode` over Mooncake behind sglang-router gives the reference's tokens
  (one chunk) for N in {1, 127, 128, 129, 130, 600, 1500}, and after each transfer D's pool holds P's V4
  rows at its own slots byte for byte.
The v41 layout (the CPU default, B300's choice) is test_cpu_sglang_engine.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sglang_shapes import sglang_tiny
from harness.router_launch import RouterFlavor

from .helpers import serving
from .sglang_servers import (DumpGroups, ONE_CHUNK, equal_pool_dumps, greedy, patient_router, prompt_of,
                             reference_greedy_over_chunks, restore, settle, sglang_server)

pytestmark = pytest.mark.timeout(1500)

LENGTHS = (1, 127, 128, 129, 130, 600, 1500)
CHUNK = 256
V4_ENV = {"SGLANG_DSV4_KV_LAYOUT": "v4"}
V4_ROW_BYTES, INDEX_ROW_BYTES = 584, 68
GROUPS = DumpGroups.of(sglang_tiny())  # the ratio-2 owner's compressed KV and index keys: one row per two tokens


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pool_dumps_v4")


@pytest.fixture(scope="module")
def engines(sglang_tiny_checkpoint, dumps, tmp_path_factory):
    logs = tmp_path_factory.mktemp("sglang_engine_v4_logs")
    pair_env = {**V4_ENV, "SGLANG_ASYM_POOL_DUMP_DIR": str(dumps)}
    servers = {
        "null": sglang_server("null", sglang_tiny_checkpoint, logs, "--chunked-prefill-size", str(CHUNK), env=V4_ENV),
        "prefill": sglang_server("prefill", sglang_tiny_checkpoint, logs, env=pair_env),
        "decode": sglang_server("decode", sglang_tiny_checkpoint, logs, env=pair_env),
    }
    with serving(servers, timeout_s=600):
        yield servers


@pytest.fixture(autouse=True)
def _shared_servers_back_to_empty(engines):
    """After each case: the module's servers healthy with empty pools, or restarted and the case failed."""
    yield
    restore(engines)


@pytest.mark.parametrize("n", LENGTHS)
def test_null_over_chunks_equals_the_reference_over_the_same_chunks(engines, sglang_tiny_checkpoint, n):
    prompt = prompt_of(n)
    expected = reference_greedy_over_chunks(sglang_tiny_checkpoint, prompt, CHUNK, "v4")
    assert greedy(engines["null"].url, prompt) == expected


def test_the_layout_changes_the_tokens(engines, sglang_tiny_checkpoint):
    """Under V4.1's release formats the same prompt gives other tokens (measured on the tiny checkpoint: the
    third token of N = 1500 differs; at N = 600 all 8 agree), so the equalities here see which caches the engine
    quantized."""
    prompt = prompt_of(1500)
    release = reference_greedy_over_chunks(sglang_tiny_checkpoint, prompt, CHUNK, "release")
    assert greedy(engines["null"].url, prompt) != release


def test_symmetric_pd_behind_sglang_router_equals_the_reference_and_ships_v4_rows(engines, sglang_tiny_checkpoint,
                                                                                   dumps):
    with patient_router(engines["prefill"], engines["decode"], RouterFlavor.SGLANG_ROUTER) as router:
        for n in LENGTHS:
            prompt = prompt_of(n)
            expected = reference_greedy_over_chunks(sglang_tiny_checkpoint, prompt, ONE_CHUNK, "v4")
            assert greedy(router.url, prompt) == expected, f"N={n}"
    seen = []
    for n, p in equal_pool_dumps(dumps, len(LENGTHS)):
        seen.append(n)
        assert p[GROUPS.last_window].shape == (min(n, 128), V4_ROW_BYTES)
        assert p[GROUPS.last_kv].shape == (n, V4_ROW_BYTES)
        assert p[GROUPS.ratio2_kv].shape == (n // 2, V4_ROW_BYTES)
        assert p[GROUPS.ratio2_index].shape == (n // 2, INDEX_ROW_BYTES)
        assert p[GROUPS.last_kv].any() and p["swa.L0"].any()
        assert not p["swa.L0"][:, -1].any()  # the V4 row's scale pad byte stays zero
    assert sorted(seen) == sorted(LENGTHS)
    assert settle([engines["prefill"], engines["decode"]]) == [0, 0]
