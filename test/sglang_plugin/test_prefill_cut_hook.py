"""P's cut inside SGLang's own DeepseekV4Model loop, on CPU (prefill_cut_checks.py runs it in a process of its own):
SGLang's causal-LM forward, `_forward_impl` and its non-CUDA layer loop run layers 0..L-1 (20 of the 40-layer
config), layer L's input is SGLang's mHC combine (its Triton kernel under Triton's CPU interpreter) of the loop's
final state, its KV path is one `forward_low_ratio_sources(q_lora=None, run_indexer=False)` on layer L's
attention at the batch's absolute positions, and the forward never reaches the logits processor or lm_head."""

import json

import pytest

from .conftest import REPO, run_python

ROWS = 9


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    log = tmp_path_factory.mktemp("cut") / "forward.jsonl"
    done = run_python([str(REPO / "test/sglang_plugin/prefill_cut_checks.py"), str(ROWS), str(log)],
                      extra_env={"TRITON_INTERPRET": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT ")), [json.loads(line) for line in log.read_text().splitlines()]


def test_the_loop_runs_layers_before_the_last_source_only(run):
    report, _ = run
    assert report["cut_bound"] is True
    assert report["layers_run"] == list(range(20))
    assert report["end_layer_after"] == 21  # the truncated model's range, restored after the loop


def test_layer_20_writes_its_kv_path_only(run):
    report, _ = run
    assert (report["kv_calls"], report["kv_layer_id"], report["kv_layer_is_source_attn"]) == (1, 20, True)
    assert (report["kv_q_lora"], report["kv_run_indexer"]) == ("None", False)
    assert report["kv_positions"] is True and report["kv_batch_is_ours"] is True
    assert report["kv_x_shape"] == [ROWS, 256]
    # norm(sum_k pre[k] * R[k]) of layer 19's output state: equal up to the last bit of bf16
    assert report["kv_x_max_abs_diff"] <= report["kv_x_max_abs"] * 2 ** -7


def test_the_forward_never_reaches_the_head(run):
    report, _ = run
    assert report["heads"] == [] and report["lm_head"] == "PPMissingLayer"
    assert (report["logits_shape"], report["logits_all_zero"]) == ([1, 1024], True)
    assert report["pp_group_restored"] is True


def test_the_forward_log(run):
    _, log = run
    assert len(log) == 1
    line = log[0]
    assert (line["role"], line["mode"], line["layers"], line["rows"]) == (
        "prefill", "extend-cut", list(range(21)), [[None, 1000, 1000 + ROWS]])
