"""The DSpark drafter: released tensor names, exact ring rollback, one parallel pass, misuse errors."""

from __future__ import annotations

import pytest
import torch

from model.helpers import prompt
from sglang_asym.checkpoint import dspark_tensor_specs
from sglang_asym.config import V41Config
from sglang_asym.model import V41Model
from sglang_asym.model.dspark import DraftRings, DSparkDrafter, random_drafter_weights
from sglang_asym.speculative import GREEDY, SpecRequest, commit, prefill_for_drafting, propose, sample_token, speculative_step

from .helpers import dspark, target


def greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_parameters_are_the_released_mtp_tensors(preset):
    cfg = V41Config.preset(preset)
    drafter = DSparkDrafter(V41Model(cfg, device="meta"))
    own = {name: tuple(t.shape) for name, t in drafter.state_dict().items()}
    assert own == {s.name: s.shape for s in dspark_tensor_specs(cfg)}
    assert len(drafter.mtp) == cfg.num_nextn_predict_layers
    assert len(drafter.mtp[0].ffn.experts) == cfg.dspark_n_routed_experts
    assert drafter.mtp[0].ffn.gate.topk == cfg.dspark_num_experts_per_tok
    assert not any(name.startswith(("embed", "head")) for name in own)  # shared with the target, not copied


def test_load_weights_checks_names_and_shapes():
    model = target()
    drafter = DSparkDrafter(model)
    weights = random_drafter_weights(model.cfg, 1)
    del weights["mtp.1.markov_head.head.weight"]
    with pytest.raises(KeyError, match="missing 1 DSpark tensor"):
        drafter.load_weights(weights)
    weights = random_drafter_weights(model.cfg, 1)
    weights["mtp.0.main_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"mtp.0.main_proj.weight: shape \(3, 3\)"):
        drafter.load_weights(weights)


def fresh(n: int, chunk: int | None = None):
    model, drafter = target(), dspark()
    cache_set = model.new_cache_set()
    cache = cache_set.new_request()
    logits, state = prefill_for_drafting(model, drafter, cache, prompt(model.cfg, n, seed=n), chunk=chunk)
    return model, drafter, cache_set, SpecRequest(cache, state, sample_token(logits, GREEDY))


@pytest.mark.parametrize("accepted", [0, 2, 4])
def test_rolled_back_rings_equal_rings_that_never_saw_the_rejected_suffix(accepted):
    model, drafter, cache_set, req = fresh(150)
    drafts = torch.randint(0, model.cfg.vocab_size, (4,), generator=torch.Generator().manual_seed(accepted)).tolist()
    pos, anchor = req.pos, req.anchor
    model(torch.tensor([anchor, *drafts]), req.cache, logits="all", capture=drafter.feature_layers)
    drafter.observe(req.draft_state, model.captured, pos)
    keep = pos + accepted + 1
    drafter.rollback(req.draft_state, keep)
    req.cache.truncate(keep)

    clean = cache_set.new_request()
    kept = torch.cat((prompt(model.cfg, 150, seed=150), torch.tensor([anchor, *drafts[:accepted]])))
    _, clean_state = prefill_for_drafting(model, drafter, clean, kept)
    assert (req.draft_state.end, clean_state.end) == (keep, keep)
    lo = keep - model.cfg.sliding_window
    assert torch.allclose(req.draft_state.read(lo, keep), clean_state.read(lo, keep), atol=1e-5)
    got = drafter.propose(req.draft_state, 11, keep, 5, greedy)
    want = drafter.propose(clean_state, 11, keep, 5, greedy)
    assert got.tokens == want.tokens and torch.allclose(got.logits, want.logits, atol=1e-4)
    req.cache.release()
    clean.release()
    cache_set.check_no_leak()


def test_chunked_and_one_shot_context_agree():
    _, drafter, cache_set, one = fresh(300)
    _, _, other_set, chunked = fresh(300, chunk=64)
    assert one.draft_state.low == 300 - one.draft_state.capacity  # only the last W + S rows are kept
    a = drafter.propose(one.draft_state, one.anchor, 300, 5, greedy)
    b = drafter.propose(chunked.draft_state, chunked.anchor, 300, 5, greedy)
    assert a.tokens == b.tokens and torch.allclose(a.logits, b.logits, atol=1e-4)
    one.cache.release()
    chunked.cache.release()


def test_one_parallel_pass_shorter_drafts_are_prefixes():
    _, drafter, _, req = fresh(90)
    full = drafter.propose(req.draft_state, req.anchor, req.pos, 5, greedy)
    for k in (1, 2, 4):
        short = drafter.propose(req.draft_state, req.anchor, req.pos, k, greedy)
        assert short.tokens == full.tokens[:k] and torch.allclose(short.logits, full.logits[:k], atol=1e-5)
    assert full.logits.shape == (5, 512) and full.confidence.shape == (5,)
    req.cache.release()


@pytest.mark.parametrize("k", [0, 6, -1, True, 2.0, None])
def test_k_out_of_range_is_refused(k):
    model, drafter, _, req = fresh(20)
    with pytest.raises(ValueError, match=r"k \(draft tokens per step\) must be an integer in \[1, 5\]"):
        speculative_step(model, drafter, req, k)
    with pytest.raises(ValueError, match="dspark_block_size"):
        propose(drafter, req, k)
    assert req.pos == 20  # nothing ran
    req.cache.release()


def test_misuse_errors():
    model, drafter, _, req = fresh(20)
    with pytest.raises(ValueError, match=r"k must be in \[1, 5\]"):
        drafter.propose(req.draft_state, req.anchor, req.pos, 6, greedy)
    with pytest.raises(ValueError, match="anchor is at 21"):
        drafter.propose(req.draft_state, req.anchor, 21, 2, greedy)
    with pytest.raises(ValueError, match="no context yet"):
        drafter.propose(drafter.new_state(), req.anchor, 20, 2, greedy)
    with pytest.raises(ValueError, match=r"verify forward of 1 \+ k = 3 tokens from position 20"):
        commit(drafter, req, 20, 2, [1], {})
    model(torch.tensor([req.anchor]), req.cache, logits="last")  # forgot capture
    with pytest.raises(ValueError, match=r"did not capture layers \[6, 7, 8\]"):
        drafter.observe(req.draft_state, model.captured, 20)
    req.cache.release()
    with pytest.raises(ValueError, match="full-role target"):
        DSparkDrafter(V41Model(V41Config.tiny(), role="prefill", device="meta"))


def test_ring_bookkeeping():
    rings = DraftRings(2, 6, 4, torch.float32, "cpu")
    rows = torch.arange(2 * 9 * 4, dtype=torch.float32).view(2, 9, 4)
    rings.append(rows[:, :3], 10)
    assert (rings.begin, rings.low, rings.end) == (10, 10, 13)
    rings.append(rows[:, 3:9], 13)  # 9 rows in a ring of 6: positions 10..12 overwritten
    assert (rings.low, rings.end) == (13, 19)
    assert torch.equal(rings.read(13, 19), rows[:, 3:9])
    with pytest.raises(IndexError, match=r"\[12, 19\) are not held"):
        rings.read(12, 19)
    with pytest.raises(ValueError, match="do not follow"):
        rings.append(rows[:, :1], 20)
    rings.truncate(15)
    rings.append(rows[:, :2], 15)
    assert torch.equal(rings.read(13, 17), torch.cat((rows[:, 3:5], rows[:, :2]), 1))
    with pytest.raises(ValueError, match="no longer kept"):
        rings.truncate(12)
    with pytest.raises(ValueError, match="holds"):
        rings.truncate(18)
