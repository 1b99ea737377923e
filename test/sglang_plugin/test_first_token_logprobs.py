"""The first output token's logprobs on the decode role (decode/first_token_logprobs.py, window_step.finish_step),
on SGLang's own Req and on the LogitsProcessorOutput as SGLang's sampler fills it (its OutputLogprobProcessor
over the log-softmax of the logits, as `Sampler.forward` calls it for a greedy batch): SGLang's commit appends
P's placeholder entries, the commit hook drops them, and the window step that completes the window appends
the entries of the token it sampled, one per output token, in the commit's shapes."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest
import torch

from sglang_asym.sglang_plugin.decode import window_step
from sglang_asym.sglang_plugin.decode.window_batch import WindowChunk, WindowSamples
from sglang_asym.sglang_plugin.shared.settings import AsymSettings

SETTINGS = AsymSettings("asym-decode", window=128, token_budget=256, window_chunk=32)
N, VOCAB = 300, 50
P_TOKEN, P_LOGPROB = 999, -0.5  # what P's metadata buffer carries for its placeholder


@pytest.fixture(autouse=True)
def _decode_settings(monkeypatch):
    monkeypatch.setattr(window_step, "_settings", lambda: SETTINGS)


def _sglang():
    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS

    cpu_import_gaps.install(STARTUP_GAPS)  # SGLang's modules import what a CPU-only venv lacks


def _req(rid: str, return_logprob: bool = True, top: int = 2, token_ids: list[int] | None = None):
    _sglang()
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "", array("q", range(N)), SamplingParams(max_new_tokens=8), return_logprob=return_logprob,
               top_logprobs_num=top, token_ids_logprob=token_ids)


def _commit(queue, decode_req):
    """What SGLang's commit appends for P's token: the token, and with return_logprob the buffer's entries."""
    req = decode_req.req
    req.output_ids.append(P_TOKEN)
    if req.return_logprob:
        lp = req.logprob
        lp.output_token_logprobs_val.append(P_LOGPROB)
        lp.output_token_logprobs_idx.append(P_TOKEN)
        lp.output_top_logprobs_val.append([P_LOGPROB] * lp.top_logprobs_num)
        lp.output_top_logprobs_idx.append([P_TOKEN] * lp.top_logprobs_num)
        if lp.token_ids_logprob is not None:
            lp.output_token_ids_logprobs_val.append([])
            lp.output_token_ids_logprobs_idx.append([])


def _committed(req):
    queue = SimpleNamespace(scheduler=SimpleNamespace(_sglang_asym_window_steps=3))
    window_step.around_commit_transfer_to_req(_commit, queue, SimpleNamespace(req=req, is_rebootstrap=False))
    assert list(req.output_ids) == [] and window_step.window_of(req) is not None
    return req


def _sampled(logits: torch.Tensor, reqs) -> WindowSamples:
    """Greedy tokens and the output SGLang's sampler writes for a batch with return_logprob."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.layers.logprob_processor import OutputLogprobProcessor

    output = LogitsProcessorOutput(next_token_logits=logits)
    tokens = torch.argmax(logits, -1)
    OutputLogprobProcessor().compute_logprobs(
        torch.log_softmax(logits, -1), [r.logprob.top_logprobs_num for r in reqs],
        [r.logprob.token_ids_logprob for r in reqs], tokens).write_output_to(output)
    return WindowSamples(tuple(int(t) for t in tokens), output)


def _logits(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(5))


def test_the_window_step_records_its_first_token_logprobs_in_place_of_ps():
    first, second = _committed(_req("a")), _committed(_req("b", top=3, token_ids=[4, 9]))
    last = window_step.window_of(first).boundary
    step = window_step.WindowStep(3, (WindowChunk(first, last, N), WindowChunk(second, last, N)))
    logits = _logits(2)
    samples = _sampled(logits, [first, second])
    assert window_step.finish_step(step, samples) == 2
    logprobs = torch.log_softmax(logits, -1)
    for row, (req, top) in enumerate(((first, 2), (second, 3))):
        token = int(logits[row].argmax())
        values, ids = logprobs[row].topk(top)
        lp = req.logprob
        assert list(req.output_ids) == [token]
        assert lp.output_token_logprobs_idx == [token]
        assert lp.output_token_logprobs_val == [pytest.approx(float(logprobs[row, token]), abs=0)]
        assert lp.output_top_logprobs_idx == [ids.tolist()]
        assert lp.output_top_logprobs_val == [values.tolist()]
    assert second.logprob.output_token_ids_logprobs_idx == [[4, 9]]
    assert second.logprob.output_token_ids_logprobs_val == [logprobs[1, [4, 9]].tolist()]
    assert first.logprob.output_token_ids_logprobs_val == []  # it asked for no token ids


def test_a_request_asking_no_top_logprobs_gets_an_empty_top_entry_as_the_commit_gives():
    req = _committed(_req("a", top=0))
    samples = _sampled(_logits(1), [req])
    window_step.finish_step(window_step.WindowStep(3, (WindowChunk(req, N - 128, N),)), samples)
    assert len(req.logprob.output_token_logprobs_val) == 1
    assert req.logprob.output_top_logprobs_val == [[]] and req.logprob.output_top_logprobs_idx == [[]]


def test_nothing_is_recorded_before_the_window_completes_or_without_return_logprob():
    partial, plain = _committed(_req("a")), _committed(_req("b", return_logprob=False))
    step = window_step.WindowStep(3, (WindowChunk(partial, N - 128, N - 96), WindowChunk(plain, N - 128, N)))
    assert window_step.finish_step(step, _sampled(_logits(2), [partial, plain])) == 1
    assert list(partial.output_ids) == [] and partial.logprob.output_token_logprobs_val == []
    assert partial.logprob.output_top_logprobs_val == []
    assert len(plain.output_ids) == 1 and plain.logprob.output_token_logprobs_val is None


def test_a_replayed_token_keeps_its_entries_from_before_the_retraction():
    req = _req("a")
    req.output_ids.extend([11, 12])
    req.logprob.output_token_logprobs_val.extend([-1.0, -2.0])
    req.logprob.output_token_logprobs_idx.extend([11, 12])
    req.pd_rebootstrap_forced_output_id = 13

    def replay(queue, decode_req):  # SGLang's commit of a rebootstrap: the kept token, no logprob entry
        decode_req.req.output_ids.append(decode_req.req.pd_rebootstrap_forced_output_id)
        decode_req.req.pd_rebootstrap_forced_output_id = None

    queue = SimpleNamespace(scheduler=SimpleNamespace(_sglang_asym_window_steps=3))
    window_step.around_commit_transfer_to_req(replay, queue, SimpleNamespace(req=req, is_rebootstrap=True))
    progress = window_step.window_of(req)
    assert progress.replayed_token
    step = window_step.WindowStep(3, (WindowChunk(req, progress.next_row, progress.end),))
    window_step.finish_step(step, _sampled(_logits(1), [req]))
    assert list(req.output_ids) == [11, 12, 13] and req.logprob.output_token_logprobs_val == [-1.0, -2.0]


def test_a_sampler_that_computed_no_logprobs_is_an_error():
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    req = _committed(_req("a"))
    samples = WindowSamples((3,), LogitsProcessorOutput(next_token_logits=_logits(1)))
    with pytest.raises(RuntimeError, match="computed no logprobs for its first token"):
        window_step.finish_step(window_step.WindowStep(3, (WindowChunk(req, N - 128, N),)), samples)
