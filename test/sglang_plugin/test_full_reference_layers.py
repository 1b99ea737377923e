"""The full model's forward on CPU through SGLang's own model loop (cpu_platform/layer_loop.py; full_layer_checks.py runs
it in a process of its own, no servers): SGLang's causal-LM forward with the reference model's block as each layer of
the nine-layer tiny config (every layer role; KV sources 1, 3, 5) and its head as the logits op gives the logits, the
drafter's features and the pool bytes of the whole-forward reference (whole_forward.py), forward for forward: prompts
of 300 and 100 tokens with decode steps after them (bounded replay's prefix rows, the floors from B in 48-row window
chunks), a prompt chunked at 200 beside a second request with --enable-deterministic-inference, a speculative verify
batch of 1 + 3 rows (plain and deterministic, one row per pass), a prompt and a verify forward capturing the drafter's
features, and two decode steps that window rows ride in."""

import json

import pytest

from sglang_asym.checkpoint import write_tokenizer
from sglang_asym.checkpoint.quantization import without_quantization
from sglang_asym.checkpoint.writer import write_checkpoint
from harness.sglang_shapes import sglang_tiny

from .conftest import REPO, run_python

# case -> (logits rows per step, rider batches per step); full_layer_checks.CASES
STEPS = {
    "prompts_then_decode": ([2, 2, 2], [0, 0, 0]),
    "chunked_prompt_deterministic": ([1, 2, 2], [0, 0, 0]),
    "verify_and_capture": ([1, 4], [0, 0]),
    "verify_deterministic": ([2, 8], [0, 0]),
    "window_rides_in_decode": ([1, 1, 1, 1, 1], [0, 0, 1, 1, 0]),
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(checkpoint, without_quantization(sglang_tiny()), seed=11, precision="release", num_shards=1,
                     progress=False)
    write_tokenizer(checkpoint, sglang_tiny())
    done = run_python([str(REPO / "test/sglang_plugin/full_layer_checks.py"), str(checkpoint)], timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


def test_the_layers_run_the_decode_roles_default_semantics_with_bounded_replay(report):
    assert (report["semantics"], report["replay"]) == ("asym-exact-encoder", "bounded-replay")


def test_a_capturing_forward_hands_the_drafter_every_rows_features(report):
    steps = report["cases"]["verify_and_capture"]["steps"]
    assert [step["hidden_shape"] for step in steps] == [[250, 3 * 64], [4, 3 * 64]]


@pytest.mark.parametrize("case", sorted(STEPS))
def test_logits_features_riders_and_pool_bytes_equal_the_whole_forward(report, case):
    result = report["cases"][case]
    rows, riders = STEPS[case]
    assert [step["rows"][0] for step in result["steps"]] == rows
    assert [step["ridden"] for step in result["steps"]] == riders
    assert all(step["logits_equal"] and step["hidden_equal"] and step["ridden_equal"] for step in result["steps"]), \
        result["steps"]
    assert result["differing"] == []
