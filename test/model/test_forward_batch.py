"""V41Model.forward_batch (several requests' rows in one pass) gives what per-request forwards give: several
requests at different positions (compressor pair boundaries, the window edge, chunked prompts), decode
rows and multi-row chunks in one pass, logits within 1e-5 (fp32) and identical greedy tokens; bad batches
are refused naming the input."""

from __future__ import annotations

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.model.model import InvalidInput, InvalidSegment, SegmentInput

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
    single, batched = model.new_cache_set(), model.new_cache_set()
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
    cache_set = full.new_cache_set()
    a, b = cache_set.new_request(), cache_set.new_request()
    out = full.forward_batch([SegmentInput(prompt(full.cfg, 9), a, "none"), SegmentInput(prompt(full.cfg, 4), b, "all")])
    assert out[0].logits is None and out[1].logits.shape == (4, full.cfg.vocab_size)
    assert (a.pos, b.pos) == (9, 4)

    prefill = build("tiny", seed=5, role="prefill")
    p_set = prefill.new_cache_set()
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
    cache_set = full.new_cache_set()
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


# ---- V41Model.deterministic: batch invariance ----------------------------------------------------------
@pytest.fixture(scope="module")
def release_model():
    m = build("tiny", seed=5, cache_quant="release")
    yield m
    m.deterministic = False


def _decode_logits_alone_and_batched(model) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode row of a 200-token request: alone, and beside 3 decode rows and a 32-row prompt chunk."""
    def prefilled(cache_set, n, seed):
        cache = cache_set.new_request()
        model(prompt(model.cfg, n, seed), cache, logits="none")
        return cache

    alone_set, batch_set = model.new_cache_set(), model.new_cache_set()
    alone = model.forward_batch([SegmentInput(torch.tensor([7]), prefilled(alone_set, 200, 1), "last")])[0].logits
    others = [SegmentInput(torch.tensor([9]), prefilled(batch_set, 50 + k, 10 + k), "last") for k in range(3)]
    inputs = [SegmentInput(torch.tensor([7]), prefilled(batch_set, 200, 1), "last"), *others,
              SegmentInput(prompt(model.cfg, 32, 99), batch_set.new_request(), "last")]
    return alone, model.forward_batch(inputs)[0].logits


def test_forward_batch_is_batch_invariant_only_in_deterministic_mode(release_model):
    """Without the mode the batch changes a request's logits in their last bits (batched matmuls, expert
    groups, padded attention); with `V41Model.deterministic` every logit is bit for bit the same."""
    release_model.deterministic = False
    alone, batched = _decode_logits_alone_and_batched(release_model)
    assert not torch.equal(alone, batched)
    assert int(alone.argmax()) == int(batched.argmax())
    release_model.deterministic = True
    alone, batched = _decode_logits_alone_and_batched(release_model)
    assert torch.equal(alone, batched)
