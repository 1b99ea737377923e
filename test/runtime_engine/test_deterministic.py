"""Deterministic inference (`--enable-deterministic-inference`): a request's logits and tokens do not
depend on what shares its forwards. Without the mode, a greedy request's logits alone and inside a batch
of decode rows and window chunks differ in their last bits (batched matmuls, expert groups, padded
attention, window chunks cut to the budget left); with it (`V41Model.deterministic`, fixed window
chunks) every logit is bit for bit the same, in `forward_batch` and through the decode loop."""

from __future__ import annotations

import threading

import pytest
import torch

from model.helpers import build, prompt
from runtime_engine.loop_helpers import run_until_done
from sglang_asym.asym import run_prefix_on_full_model
from sglang_asym.cache import CacheSizing
from sglang_asym.model.model import SegmentInput
from sglang_asym.runtime.engine.decode_loop import ActiveRequest, DecodeLoop
from sglang_asym.runtime.engine_api import SamplingParams
from sglang_asym.sched import SchedulerConfig
from sglang_asym.split import SplitPlan

SIZING = CacheSizing(max_requests=16, max_tokens=1024)
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def model():
    m = build("tiny", seed=5, cache_quant="release")
    yield m
    m.deterministic = False


def _decode_logits_alone_and_batched(model) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode row of a 200-token request: alone, and beside 3 decode rows and a 32-row prompt chunk."""
    def prefilled(cache_set, n, seed):
        cache = cache_set.new_request()
        model(prompt(model.cfg, n, seed), cache, logits="none")
        return cache

    alone_set, batch_set = model.new_cache_set(SIZING), model.new_cache_set(SIZING)
    alone = model.forward_batch([SegmentInput(torch.tensor([7]), prefilled(alone_set, 200, 1), "last")])[0].logits
    others = [SegmentInput(torch.tensor([9]), prefilled(batch_set, 50 + k, 10 + k), "last") for k in range(3)]
    inputs = [SegmentInput(torch.tensor([7]), prefilled(batch_set, 200, 1), "last"), *others,
              SegmentInput(prompt(model.cfg, 32, 99), batch_set.new_request(), "last")]
    return alone, model.forward_batch(inputs)[0].logits


def test_forward_batch_is_batch_invariant_only_in_deterministic_mode(model):
    model.deterministic = False
    alone, batched = _decode_logits_alone_and_batched(model)
    assert not torch.equal(alone, batched)  # the batch changed the last bits
    assert int(alone.argmax()) == int(batched.argmax())
    model.deterministic = True
    alone, batched = _decode_logits_alone_and_batched(model)
    assert torch.equal(alone, batched)


class _RecordingLoop(DecodeLoop):
    """A DecodeLoop that keeps every logits row it samples from, per request."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sampled: dict[str, list[torch.Tensor]] = {}

    def _window_done(self, item, out):
        if item.final:
            self.sampled.setdefault(item.req.rid, []).append(out.logits.clone())
        return super()._window_done(item, out)

    def _decoded(self, item, out, stats):
        self.sampled.setdefault(item.req.rid, []).append(out.logits.clone())
        return super()._decoded(item, out, stats)


def _serve(model, prompts: dict[str, torch.Tensor]) -> tuple[dict[str, list[int]], dict[str, list[torch.Tensor]], list]:
    """Greedy tokens, sampled logits and step records of `prompts`, all submitted at once to one loop."""
    sizing = CacheSizing(max_requests=len(prompts) + 1, max_tokens=512, max_chunk_tokens=128)
    cache_set = model.new_cache_set(sizing)
    tokens: dict[str, list[int]] = {}
    lock, done, finished = threading.Lock(), threading.Event(), set()

    def emitter(rid):
        def emit(event):
            with lock:
                tokens.setdefault(rid, []).extend(event.new_token_ids)
                if event.finished:
                    finished.add(rid)
                    if len(finished) == len(prompts):
                        done.set()
        return emit

    sched = SchedulerConfig(token_budget=40, max_window_rows_per_step=128, max_running=8, num_draft_tokens=0,
                            window=128, window_chunk=16)
    steps: list = []
    loop = _RecordingLoop(model, cache_set, sched, eos_token_id=-1, on_step=steps.append)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    for rid, p in prompts.items():
        split = SplitPlan(model.cfg, p.numel(), 128, "asym-exact-encoder")
        prefix = run_prefix_on_full_model(model, model.new_cache_set(sizing), p, split)
        loop.submit(ActiveRequest(rid, p, split, prefix, params, emitter(rid)))
    run_until_done(loop, done, cache_set)
    return tokens, loop.sampled, steps


@pytest.mark.parametrize("batch", [2, 5, 8])
def test_decode_loop_alone_equals_in_a_batch_only_in_deterministic_mode(model, batch):
    """Request `a` (a 200-token prompt: its 128-row window runs in chunks) alone, then with batch - 1
    others of mixed lengths arriving with it (their windows and decode rows share a's steps)."""
    target = {"a": prompt(model.cfg, 200, seed=1)}
    crowd = {**target, **{f"q{k}": prompt(model.cfg, 40 + 37 * k, seed=20 + k) for k in range(batch - 1)}}
    results = {}
    for deterministic in (False, True):
        model.deterministic = deterministic
        alone_tokens, alone_logits, _ = _serve(model, target)
        crowd_tokens, crowd_logits, steps = _serve(model, crowd)
        assert any(s.decode_rows and s.window_rows for s in steps)  # windows mixed with decode rows
        assert len(alone_logits["a"]) == len(crowd_logits["a"]) == NEW_TOKENS
        same = [torch.equal(x, y) for x, y in zip(alone_logits["a"], crowd_logits["a"])]
        results[deterministic] = (alone_tokens["a"] == crowd_tokens["a"], all(same))
    model.deterministic = False
    assert results[False][1] is False  # without the mode the batch changes a's logits
    assert results[True] == (True, True)  # with it: the same tokens from bit-identical logits
