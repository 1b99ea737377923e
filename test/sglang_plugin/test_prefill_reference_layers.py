"""P's forward on CPU through SGLang's own model loop (cpu_platform/reference_layer.py and layer_loop.py; prefill_layer_checks.py runs it
in a process of its own, no servers): SGLang's causal-LM forward with P's cut, the reference model's block as each of
layers 0..19, layer 20's KV path through SGLang's attention backend, writes the same pool as today's whole-forward
reference (reference_forward.py) for prompts of N = 129, 300 and 1000 (P's prefix in SGLang's 512-token chunks),
two requests in one batch, and two requests with --enable-deterministic-inference: every byte of every pool
buffer, but for one encoding difference in layer 20's index keys, where SGLang's fp4 quantizer
(`set_index_k_fp4`) writes a zero as +0 and the reference's mxfp4 packer keeps the sign of a negative value that
rounds to zero (-0): the same values, other bytes."""

import json

import pytest

from sglang_asym.checkpoint import write_tokenizer
from sglang_asym.checkpoint.quantization import without_quantization
from sglang_asym.checkpoint.writer import write_checkpoint
from harness.sglang_shapes import sglang_small

from .conftest import REPO, run_python

WINDOW = 128
# case -> the prefixes B = N - W of its requests (prefill_layer_checks.CASES)
PREFIXES = {"n129": [1], "n300": [172], "n1000_chunked": [872], "batch_129_300": [1, 172],
            "batch_300_1000_deterministic": [172, 872]}
FORWARDS = {"n129": 1, "n300": 1, "n1000_chunked": 2, "batch_129_300": 1, "batch_300_1000_deterministic": 2}
KV_OWNERS = {2: 2, 8: 2, 14: 2, 20: 1}  # sglang_small's KV sources and their compression ratios
ENCODING_ONLY = "index.c1.L20"  # layer 20's index keys: zeros as +0 (SGLang) or signed (the reference)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(checkpoint, without_quantization(sglang_small()), seed=11, precision="release", num_shards=3,
                     progress=False)
    write_tokenizer(checkpoint, sglang_small())
    log = tmp_path_factory.mktemp("log") / "forward.jsonl"
    # the asym-prefill server's environment (server_defaults.prefill_environment)
    done = run_python([str(REPO / "test/sglang_plugin/prefill_layer_checks.py"), str(checkpoint), str(log)],
                      timeout=1200, extra_env={"TRITON_INTERPRET": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT ")), [json.loads(line) for line in log.read_text().splitlines()]


def test_sglangs_forward_runs_with_the_reference_blocks_as_layers_0_to_19(run):
    report, _ = run
    assert (report["layer_forward"], report["loop_role"]) == ("LayerForward", "prefill")
    assert report["layers_substituted"] == list(range(20))


@pytest.mark.parametrize("case", sorted(PREFIXES))
def test_the_pool_holds_the_bytes_the_whole_forward_reference_writes(run, case):
    result = run[0]["cases"][case]
    assert result["forwards"] == FORWARDS[case]
    assert set(result["differing"]) <= {ENCODING_ONLY}, result["differing"]
    for name, diff in result["differing"].items():
        assert diff["zero_sign_only"] is True and diff["bytes"] > 0, (name, diff)
    prefixes = PREFIXES[case]
    expected = {f"swa.L{i}" for i in range(20)}
    for owner, ratio in KV_OWNERS.items():
        if max(prefixes) >= ratio:
            expected |= {f"kv.c{ratio}.L{owner}", f"index.c{ratio}.L{owner}"}
        if ratio == 2 and any(b % 2 for b in prefixes):
            expected.add(f"pair_ring.L{owner}")
    assert set(result["written"]["reference"]) == expected
    assert set(result["written"]["sglang_loop"]) == expected


def test_the_forward_log_shows_layers_0_to_19_and_layer_20s_kv_path_per_forward(run):
    _, log = run
    cut = [line for line in log if line["mode"] == "extend-cut"]  # the reference's own forwards log "extend"
    assert len(cut) == sum(FORWARDS.values())
    assert all(line["role"] == "prefill" and line["layers"] == list(range(21)) for line in cut)
    # each request's rows by bootstrap room (the check gives req slot k room 1000 + k), P's chunks of 512
    assert [line["rows"] for line in cut] == [
        [[1001, 0, 1]], [[1001, 0, 172]], [[1001, 0, 512]], [[1001, 512, 872]],
        [[1001, 0, 1], [1002, 0, 172]], [[1001, 0, 172], [1002, 0, 512]], [[1002, 512, 872]]]
