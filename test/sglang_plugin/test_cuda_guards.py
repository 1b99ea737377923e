"""The launch guards of an asymmetric server on CUDA, one per setting the path does not handle, on SGLang
0.5.23's own ServerArgs records (device "cuda"; nothing here needs a GPU: the guards read the record)."""

import dataclasses

import pytest

from sglang_asym.config import V41Config
from sglang_asym.sglang_plugin.shared.cuda_guards import cuda_refusals, prefill_graph_backend, refuse_unhandled_cuda_settings
from sglang_asym.sglang_plugin.hooks import TOKENIZER_ROLE, after_publish
from sglang_asym.sglang_plugin.shared.settings import AsymSettings, attach
from sglang_asym.sglang_plugin.shared.validation import AsymArgumentError

PREFILL, DECODE = AsymSettings("asym-prefill"), AsymSettings("asym-decode")
CFG = V41Config.tiny()
# the settings a CUDA asym-prefill server must be given: no bounded replay, no prefill graph
PREFILL_OK = dict(enable_decoder_swa_bounded_replay=False, cuda_graph_backend_prefill="disabled")


def record(checkpoint, **fields):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=str(checkpoint), device="cuda", **fields)


def test_handled_records_pass(v41_checkpoint):
    assert cuda_refusals(record(v41_checkpoint, **PREFILL_OK), PREFILL, CFG) == []
    assert cuda_refusals(record(v41_checkpoint), DECODE, CFG) == []  # D keeps SGLang's defaults
    assert cuda_refusals(record(v41_checkpoint, speculative_algorithm="DSPARK"), DECODE, CFG) == []


def test_bounded_replay_on_prefill(v41_checkpoint):
    message = ("decoder SWA bounded replay is on for the asym-prefill server (SGLang's default on CUDA): it would "
               "run layers >= 5, which this role does not hold; pass --no-enable-decoder-swa-bounded-replay")
    for replay in (None, True):  # None: SGLang's auto, resolving on for both PD roles on CUDA
        args = record(v41_checkpoint, enable_decoder_swa_bounded_replay=replay, cuda_graph_backend_prefill="disabled")
        assert cuda_refusals(args, PREFILL, CFG) == [message]


@pytest.mark.parametrize("flags, backend", [
    ({}, "breakable"),  # SGLang's default prefill backend on CUDA
    ({"cuda_graph_backend_prefill": "breakable"}, "breakable"),
    ({"cuda_graph_backend_prefill": "full"}, "full"),
])
def test_prefill_graph_on_prefill(v41_checkpoint, flags, backend):
    args = record(v41_checkpoint, enable_decoder_swa_bounded_replay=False, **flags)
    assert prefill_graph_backend(args) == backend
    assert cuda_refusals(args, PREFILL, CFG) == [
        f"the asym-prefill server runs its prefill CUDA graph as {backend!r}, which has not run the prefill cut "
        "(a breakable graph's KV-source break reads the stripped query path); pass --cuda-graph-backend-prefill "
        "disabled"]
    assert cuda_refusals(record(v41_checkpoint, disable_prefill_cuda_graph=True,
                                enable_decoder_swa_bounded_replay=False), PREFILL, CFG) == []


def test_parallel_sizes(v41_checkpoint):
    args = record(v41_checkpoint, tp_size=2, dp_size=2, ep_size=2, pp_size=2)
    assert cuda_refusals(args, DECODE, CFG) == [
        "--tp-size 2, --dp-size 2, --ep-size 2, --pp-size 2: the asym-decode server runs on one GPU (one rank holds "
        "every head and expert its role computes); set these to 1 and scale out with more servers behind the router"]
    assert cuda_refusals(record(v41_checkpoint, pp_size=4, **PREFILL_OK), PREFILL, CFG) == [
        "--pp-size 4: the asym-prefill server runs on one GPU (one rank holds every head and expert its role "
        "computes); set these to 1 and scale out with more servers behind the router"]


def test_engram_on_last_kv_source(v41_checkpoint):
    engram_at_last = dataclasses.replace(CFG, engram_layer_ids=(CFG.last_kv_source,), engram_num_embeddings=(1000,))
    expected = ["the checkpoint puts an Engram on layer 5, its last KV source: SGLang's tail-source KV write (the "
                "prefill cut) does not run an Engram; serve it with a symmetric server"]
    assert cuda_refusals(record(v41_checkpoint, **PREFILL_OK), PREFILL, engram_at_last) == expected
    assert cuda_refusals(record(v41_checkpoint), DECODE, engram_at_last) == expected


@pytest.mark.parametrize("algorithm", ["EAGLE", "NGRAM"])
def test_speculation_other_than_dspark_on_decode(v41_checkpoint, algorithm):
    assert cuda_refusals(record(v41_checkpoint, speculative_algorithm=algorithm), DECODE, CFG) == [
        f"--speculative-algorithm {algorithm}: the asym-decode server speculates with DSPARK only; pass "
        "--speculative-algorithm DSPARK or none"]


def test_cpu_records_are_not_guarded(v41_checkpoint):
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(v41_checkpoint), device="cpu", tp_size=2, speculative_algorithm="EAGLE")
    assert cuda_refusals(args, DECODE, CFG) == []
    refuse_unhandled_cuda_settings(args, DECODE)  # no error


def test_launch_refuses_every_unhandled_setting_at_publish(v41_checkpoint):
    args = record(v41_checkpoint, tp_size=2)  # P with SGLang's CUDA defaults: replay on, breakable graph
    attach(args, PREFILL)
    with pytest.raises(AsymArgumentError) as err:
        after_publish(None, args, role=TOKENIZER_ROLE)
    text = str(err.value)
    assert text.startswith("--disaggregation-mode asym-prefill on CUDA cannot run with:\n  - decoder SWA bounded replay")
    assert text.count("\n  - ") == 3 and "--no-enable-decoder-swa-bounded-replay" in text
    assert "--cuda-graph-backend-prefill disabled" in text and "--tp-size 2" in text
