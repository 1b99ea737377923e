"""V41Model.forward_batch (several requests' rows in one pass) gives what per-request forwards give: several
requests at different positions (compressor pair boundaries, the window edge, chunked prompts), decode
rows and multi-row chunks in one pass, logits within 1e-5 (fp32) and identical greedy tokens. And the
DecodeLoop (its batched forwards through the model runner): mixed / separate / chunked / admit-all steps
give the reference tokens, and a request that fails inside a batched forward fails alone."""

from __future__ import annotations

import pytest
import torch

from model.helpers import build, prompt
from runtime_engine.loop_helpers import run_until_done
from sglang_asym.cache import CacheSizing
from sglang_asym.model.model import InvalidInput, InvalidSegment, SegmentInput

SIZING = CacheSizing(max_requests=16, max_tokens=1024)
LENGTHS = (1, 2, 127, 128, 129, 130, 257)  # odd/even starts: a held compressor tail or none
CAPTURE = (6, 8)


# fp32 without cache quantization: 1e-5. With the release formats a last-ulp difference of a batched
# matmul can move a value across an FP4/FP8 rounding boundary, so only the tokens must stay identical.
TOLERANCE = {"none": 1e-5, "release": 1e-3}


@pytest.fixture(scope="module", params=["none", "release"])
def model(request):
    return build("tiny", seed=5, cache_quant=request.param)


def _tol(model) -> float:
    return TOLERANCE[model.quant.mode]


def _twin_caches(model, lengths):
    """The same prompts prefilled into two cache sets: one for per-request forwards, one for batches."""
    single, batched = model.new_cache_set(SIZING), model.new_cache_set(SIZING)
    pairs, logits = [], []
    for n in lengths:
        tokens = prompt(model.cfg, n, seed=n)
        a, b = single.new_request(), batched.new_request()
        logits.append(model(tokens, a))
        model(tokens, b)
        pairs.append((a, b))
    return single, batched, pairs, logits


def test_batched_decode_steps_equal_per_request_forwards(model):
    single, batched, pairs, last = _twin_caches(model, LENGTHS)
    tokens = [int(torch.argmax(x)) for x in last]
    worst = 0.0
    for step in range(6):
        want = [model(torch.tensor([t]), a, logits="last", capture=CAPTURE) for t, (a, _) in zip(tokens, pairs)]
        want_captured = [dict(model.captured)]
        got = model.forward_batch([SegmentInput(torch.tensor([t]), b, "last", CAPTURE) for t, (_, b) in zip(tokens, pairs)])
        for w, g, (a, b) in zip(want, got, pairs):
            assert g.logits.shape == w.shape == (model.cfg.vocab_size,)
            worst = max(worst, float((g.logits - w).abs().max()))
            assert int(torch.argmax(g.logits)) == int(torch.argmax(w))
            assert a.pos == b.pos
            assert set(g.captured) == set(CAPTURE) and g.captured[6].shape == (1, model.cfg.hidden_size)
        assert torch.allclose(got[-1].captured[8], want_captured[0][8], atol=_tol(model))
        tokens = [int(torch.argmax(w)) for w in want]
    assert worst <= _tol(model), f"batched vs per-request logits differ by {worst}"
    for a, b in pairs:
        a.release()
        b.release()
    single.check_no_leak()
    batched.check_no_leak()


@pytest.mark.parametrize("chunk,length", [(1, 9), (7, 75), (32, 75)])
def test_mixed_batch_of_decode_rows_and_prompt_chunks(model, chunk, length):
    """Decode rows of running requests next to another request's prompt chunks (the window step split
    into chunks), the chunk boundaries falling on odd and even positions: same logits as alone."""
    single, batched, pairs, last = _twin_caches(model, (129, 2, 300))
    tokens = [int(torch.argmax(x)) for x in last]
    new_prompt = prompt(model.cfg, length, seed=99)
    new_a, new_b = single.new_request(), batched.new_request()
    worst = 0.0
    for a0 in range(0, new_prompt.numel(), chunk):
        piece = new_prompt[a0 : a0 + chunk]
        want = [model(torch.tensor([t]), a) for t, (a, _) in zip(tokens, pairs)]
        want_chunk = model(piece, new_a, logits="all")
        inputs = [SegmentInput(torch.tensor([t]), b) for t, (_, b) in zip(tokens, pairs)]
        inputs.insert(1, SegmentInput(piece, new_b, "all"))  # the chunk sits between decode rows
        got = model.forward_batch(inputs)
        got_chunk = got.pop(1).logits
        assert got_chunk.shape == want_chunk.shape == (piece.numel(), model.cfg.vocab_size)
        worst = max(worst, float((got_chunk - want_chunk).abs().max()))
        assert torch.equal(got_chunk.argmax(-1), want_chunk.argmax(-1))
        for w, g in zip(want, got):
            worst = max(worst, float((g.logits - w).abs().max()))
            assert int(torch.argmax(g.logits)) == int(torch.argmax(w))
        tokens = [int(torch.argmax(w)) for w in want]
    assert worst <= _tol(model), f"batched vs per-request logits differ by {worst}"
    assert new_b.pos == new_a.pos == new_prompt.numel()
    # a verify-shaped step (q_len 1 + k) for every request, then each rolled back to a shorter prefix
    verify = [torch.tensor([t, 3, 4, 5]) for t in tokens]
    caches = pairs + [(new_a, new_b)]
    verify.append(torch.tensor([7, 8, 9, 10]))
    want = [model(v, a, logits="all") for v, (a, _) in zip(verify, caches)]
    got = model.forward_batch([SegmentInput(v, b, "all") for v, (_, b) in zip(verify, caches)])
    for w, g, (a, b) in zip(want, got, caches):
        assert float((g.logits - w).abs().max()) <= _tol(model)
        assert torch.equal(g.logits.argmax(-1), w.argmax(-1))
        a.truncate(a.pos - 2)
        b.truncate(b.pos - 2)
    want = [model(torch.tensor([1]), a) for a, _ in caches]
    got = model.forward_batch([SegmentInput(torch.tensor([1]), b) for _, b in caches])
    assert max(float((g.logits - w).abs().max()) for g, w in zip(got, want)) <= _tol(model)


def test_logits_none_and_prefill_role():
    full = build("tiny", seed=5)
    cache_set = full.new_cache_set(SIZING)
    a, b = cache_set.new_request(), cache_set.new_request()
    out = full.forward_batch([SegmentInput(prompt(full.cfg, 9), a, "none"), SegmentInput(prompt(full.cfg, 4), b, "all")])
    assert out[0].logits is None and out[1].logits.shape == (4, full.cfg.vocab_size)
    assert (a.pos, b.pos) == (9, 4)

    prefill = build("tiny", seed=5, role="prefill")
    p_set = prefill.new_cache_set(SIZING)
    p_batch = [p_set.new_request() for _ in range(2)]
    p_alone = [p_set.new_request() for _ in range(2)]
    prompts = [prompt(prefill.cfg, 301, seed=1), prompt(prefill.cfg, 130, seed=2)]
    assert [o.logits for o in prefill.forward_batch([SegmentInput(t, c) for t, c in zip(prompts, p_batch)])] == [None, None]
    for t, c in zip(prompts, p_alone):
        prefill(t, c)
    for c, d in zip(p_batch, p_alone):
        assert c.groups.keys() == d.groups.keys()
        for name in c.groups:
            assert torch.allclose(c.rows(name).read(), d.rows(name).read(), atol=1e-6), name


def test_bad_batches_are_refused():
    full = build("tiny", seed=5)
    cache_set = full.new_cache_set(SIZING)
    a = cache_set.new_request()
    with pytest.raises(ValueError, match="at least one input"):
        full.forward_batch([])
    with pytest.raises(InvalidSegment, match="batch input 1: one request cache appears twice") as twice:
        full.forward_batch([SegmentInput(prompt(full.cfg, 3), a), SegmentInput(prompt(full.cfg, 2), a)])
    assert twice.value.index == 1 and isinstance(twice.value.error, ValueError)
    with pytest.raises(InvalidSegment, match="outside the vocabulary") as bad_token:
        full.forward_batch([SegmentInput(torch.tensor([full.cfg.vocab_size]), a)])
    assert isinstance(bad_token.value.error, InvalidInput)
    with pytest.raises(InvalidInput):  # a single forward raises the error itself
        full(torch.tensor([full.cfg.vocab_size]), a)
    b = cache_set.new_request()
    full(prompt(full.cfg, 5), b)
    b.pos += 1  # claims a token its rows do not hold: refused before any layer runs
    with pytest.raises(InvalidSegment, match="batch input 1: layer 0: window rows end at 5, the request is at position 6"):
        full.forward_batch([SegmentInput(prompt(full.cfg, 2), a), SegmentInput(prompt(full.cfg, 1), b)])
    assert a.pos == 0 and a.rows("swa.L0").end == 0


# ---- the decode loop's batched steps -------------------------------------------------------------------
def _loop_tokens(model, prompts, sched, joins=()):
    """Serve prompts (and `joins`: (rid, prompt, install) already running) in one DecodeLoop; tokens and
    final events by rid, and the step records."""
    import threading

    from sglang_asym.asym import run_prefix_on_full_model
    from sglang_asym.runtime.engine.decode_loop import ActiveRequest, DecodeLoop
    from sglang_asym.runtime.engine_api import SamplingParams
    from sglang_asym.split import SplitPlan

    sizing = CacheSizing(max_requests=len(prompts) + len(joins) + 1, max_tokens=512, max_chunk_tokens=128)
    cache_set = model.new_cache_set(sizing)
    tokens, finals, steps, lock, done = {}, {}, [], threading.Lock(), threading.Event()
    total = len(prompts) + len(joins)

    def emitter(rid):
        def emit(event):
            with lock:
                tokens.setdefault(rid, []).extend(event.new_token_ids)
                if event.finished:
                    finals[rid] = event
                    if len(finals) == total:
                        done.set()
        return emit

    loop = DecodeLoop(model, cache_set, sched, eos_token_id=-1, on_step=steps.append)
    params = SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)
    for rid, p in prompts.items():
        split = SplitPlan(model.cfg, p.numel(), 128, "asym-exact-encoder")
        prefix = run_prefix_on_full_model(model, model.new_cache_set(sizing), p, split)
        loop.submit(ActiveRequest(rid, p, split, prefix, params, emitter(rid)))
    for rid, p, first, install in joins:
        split = SplitPlan(model.cfg, p.numel(), 128, "exact")
        loop.submit_running(ActiveRequest(rid, p, split, None, params, emitter(rid),
                                          generator=torch.Generator().manual_seed(0)), first, install)
    run_until_done(loop, done, cache_set)
    return tokens, finals, steps


def _reference_tokens(model, p, n=6):
    from sglang_asym.model.steps import greedy_continue

    cache = model.new_cache_set(SIZING).new_request()
    out, _ = greedy_continue(model, cache, model(p, cache), n)
    cache.release()
    return out


@pytest.fixture(scope="module")
def release_model():
    return build("tiny", seed=6, cache_quant="release")


@pytest.mark.parametrize("mode,policy,chunk", [("mixed", "budget", 16), ("separate", "budget", 16),
                                               ("mixed", "budget", None), ("mixed", "admit_all", None)])
def test_loop_steps_give_the_reference_tokens(release_model, mode, policy, chunk):
    """Six requests at once, windows whole or chunked to the budget, mixed or separate forwards: every
    step is one batched forward (two in separate mode) and every request gets the reference tokens."""
    from sglang_asym.sched import SchedulerConfig

    model = release_model
    prompts = {f"q{n}": prompt(model.cfg, n, seed=n) for n in (1, 37, 128, 129, 200, 300)}
    sched = SchedulerConfig(token_budget=48, max_window_rows_per_step=128, max_running=6, num_draft_tokens=0,
                            window=128, mode=mode, policy=policy, window_chunk=chunk)
    got, finals, steps = _loop_tokens(model, prompts, sched)
    assert got == {rid: _reference_tokens(model, p) for rid, p in prompts.items()}
    assert all(e.error is None for e in finals.values())
    if policy == "budget" and chunk:
        assert all(s.decode_rows + s.window_rows <= 48 for s in steps)
        assert any(s.decode_rows and s.window_rows for s in steps)  # later chunks run beside decode rows


def test_a_request_failing_inside_a_batched_forward_fails_alone(release_model):
    """One request's cache is broken (its window rows end one row short of its position): the batched
    forward raises; the others are rolled back, rerun alone and still get their reference tokens."""
    from sglang_asym.sched import SchedulerConfig

    model = release_model
    prompts = {f"q{n}": prompt(model.cfg, n, seed=n) for n in (5, 130)}
    good, bad = prompt(model.cfg, 40, seed=1), prompt(model.cfg, 41, seed=2)

    def install_good(cache_set):
        cache = cache_set.new_request()
        model(good, cache, logits="none")
        return cache

    def install_bad(cache_set):
        cache = cache_set.new_request()
        model(bad[:-1], cache, logits="none")
        cache.pos += 1  # claims a token its window rows do not hold
        return cache

    first_good = _reference_tokens(model, good, 1)[0]
    sched = SchedulerConfig(token_budget=300, max_window_rows_per_step=300, max_running=4, num_draft_tokens=0,
                            window=128)
    got, finals, _ = _loop_tokens(model, prompts, sched,
                                  joins=[("good", good, first_good, install_good), ("bad", bad, 7, install_bad)])
    assert finals["bad"].error is not None and "decode step failed" in finals["bad"].error
    assert got["bad"] == [7]  # its first token went out when it joined; nothing after the failure
    assert got["good"] == _reference_tokens(model, good)
    for rid, p in prompts.items():
        assert got[rid] == _reference_tokens(model, p) and finals[rid].error is None


def test_a_failure_midway_through_a_batched_forward_restores_the_others(release_model):
    """One request's window rows were cut short at the front (its check passes, its attention fails in
    layer 0 after every request's rows were written there): the others are restored (decode rows rolled
    back, windows recomputed from their prefix state), rerun alone, and get their reference tokens."""
    from sglang_asym.sched import SchedulerConfig

    model = release_model
    prompts = {f"q{n}": prompt(model.cfg, n, seed=n) for n in (5, 130, 300)}
    good, bad = prompt(model.cfg, 41, seed=1), prompt(model.cfg, 200, seed=2)

    def install(tokens, cut):
        def make(cache_set):
            cache = cache_set.new_request()
            model(tokens, cache, logits="none")
            if cut:
                cache.rows("swa.L0").drop_before(tokens.numel() - 5)  # keys the next query needs are gone
            return cache
        return make

    sched = SchedulerConfig(token_budget=300, max_window_rows_per_step=300, max_running=5, num_draft_tokens=0,
                            window=128, window_chunk=100)
    first_good = _reference_tokens(model, good, 1)[0]
    got, finals, _ = _loop_tokens(model, prompts, sched, joins=[("good", good, first_good, install(good, False)),
                                                                ("bad", bad, 7, install(bad, True))])
    assert "decode step failed: layer 0: window rows from 73 are needed" in finals["bad"].error
    assert got["bad"] == [7]
    assert got["good"] == _reference_tokens(model, good)
    for rid, p in prompts.items():
        assert got[rid] == _reference_tokens(model, p) and finals[rid].error is None, rid
