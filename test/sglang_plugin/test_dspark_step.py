"""The CPU engine's DSpark step (dspark_step.py) over the reference forward and an in-memory pool, without servers.

The same code the platform's speculative worker runs per SGLang decode step: drafts from each request's
drafter context, ONE verify forward of 1 + k rows per request (SGLang's TARGET_VERIFY batch), SGLang's
greedy accept rule, the contexts rolled back to the committed length. Two requests (a pending ratio-2
pair token at an odd length, none at an even one) decode together, and their tokens equal plain one-row
greedy decoding with the project's DSpark drafter (random weights: it rarely hits) and with an oracle
drafter that knows the greedy continuation and spoils one draft per step, so every accepted length
0 .. k occurs."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.model.dspark import Draft, DSparkDrafter, random_drafter_weights
from sglang_asym.sglang_plugin.cpu_platform import reference_forward
from sglang_asym.sglang_plugin.cpu_platform.dspark_step import DraftContexts, VerifyRows, accept_greedy, speculative_step
from sglang_asym.sglang_plugin.cpu_platform.reference_forward import DEFAULT_SEMANTICS, RequestRows
from sglang_plugin.whole_forward import ReferenceForward

from .memory_rows import MemoryRows, Mode

PROMPTS = {0: 41, 1: 40}  # req slot: prompt length
RIDS = {0: "odd", 1: "even"}
K = 3  # drafts per step
NEW_TOKENS = 14


class _Full:
    """SGLang's CaptureHiddenMode.FULL as the reference forward asks it."""

    @staticmethod
    def is_full() -> bool:
        return True


@pytest.fixture(autouse=True)
def plain_records(monkeypatch):
    """The prompt lengths the init_new hook records; SGLang's LogitsProcessorOutput as a plain record."""
    records = {slot: reference_forward.RequestRecord(n) for slot, n in PROMPTS.items()}
    monkeypatch.setattr(reference_forward.RECORDS, "requests", records)
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.logits_processor",
                        SimpleNamespace(LogitsProcessorOutput=SimpleNamespace))


@pytest.fixture(scope="module")
def model():
    return build("tiny", seed=5, cache_quant="release")


def _prompts(cfg) -> dict[int, torch.Tensor]:
    return {slot: prompt(cfg, n, seed=slot + 7) for slot, n in PROMPTS.items()}


def _batch(mode: str, tokens: list[torch.Tensor], starts: list[int], capture: bool, q: int = 1):
    return (torch.cat(tokens), torch.cat([torch.arange(s, s + t.numel()) for s, t in zip(starts, tokens)]),
            SimpleNamespace(forward_mode=Mode(mode), batch_size=len(tokens), req_pool_indices=torch.tensor(list(PROMPTS)),
                            extend_seq_lens_cpu=[t.numel() for t in tokens], spec_info=SimpleNamespace(draft_token_num=q),
                            capture_hidden_mode=_Full() if capture else None))


def _prefill(model, capture: bool, deterministic: bool = True):
    forward = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS, deterministic=deterministic)
    tokens = list(_prompts(model.cfg).values())
    out = forward(*_batch("extend", tokens, [0] * len(tokens), capture))
    return forward, out


@pytest.fixture(scope="module")
def plain(model) -> dict[int, list[int]]:
    """Greedy tokens of one-row decode steps after the prompts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reference_forward.RECORDS, "requests", {s: reference_forward.RequestRecord(n) for s, n in PROMPTS.items()})
        patch.setitem(sys.modules, "sglang.srt.layers.logits_processor",
                      SimpleNamespace(LogitsProcessorOutput=SimpleNamespace))
        forward, out = _prefill(model, capture=False)
        assert out.hidden_states is None
        tokens = {slot: [int(row.argmax())] for slot, row in zip(PROMPTS, out.next_token_logits)}
        while len(tokens[0]) < NEW_TOKENS:
            last = [torch.tensor(tokens[slot][-1:]) for slot in PROMPTS]
            out = forward(*_batch("decode", last, [PROMPTS[s] + len(tokens[s]) - 1 for s in PROMPTS], False))
            for slot, row in zip(PROMPTS, out.next_token_logits):
                tokens[slot].append(int(row.argmax()))
        return tokens


class OracleDrafter:
    """Proposes the greedy continuation (the plain decoding's tokens) with the draft at index
    `spoil[step % len(spoil)]` made wrong (an index >= k spoils none)."""

    feature_layers = ()

    def __init__(self, sequences: dict[int, list[int]], spoil: tuple[int, ...]) -> None:
        self.sequences, self.spoil, self.steps = sequences, spoil, 0

    def new_state(self) -> dict:
        return {}

    def observe(self, state, captured, first_pos) -> None:
        pass

    def rollback(self, state, pos) -> None:
        pass

    def propose(self, state, anchor, pos, k, choose) -> Draft:
        matching = [seq for seq in self.sequences.values() if len(seq) > pos and seq[pos] == anchor]
        assert len(matching) == 1, (pos, anchor)
        bad = self.spoil[self.steps % len(self.spoil)]
        self.steps += 1
        tokens = [t if j != bad else t + 1 for j, t in enumerate(matching[0][pos + 1:pos + 1 + k])]
        tokens += [0] * (k - len(tokens))
        return Draft(tuple(tokens), torch.zeros(k, 1))


def _speculate(model, drafter, deterministic: bool = True) -> tuple[dict[int, list[int]], list[int], DraftContexts]:
    """Prefill with capture, then DSpark steps until every request has NEW_TOKENS: (tokens, accepted lengths)."""
    forward, out = _prefill(model, capture=True, deterministic=deterministic)
    layers = model.cfg.dspark_target_layer_ids
    assert out.hidden_states.shape == (sum(PROMPTS.values()), len(layers) * model.cfg.hidden_size)
    contexts = DraftContexts(drafter, layers)
    at = 0
    for slot, n in PROMPTS.items():
        contexts.observe(slot, RIDS[slot], out.hidden_states[at:at + n], 0)
        at += n
    bonus = out.next_token_logits.argmax(dim=-1)
    tokens = {slot: [int(b)] for slot, b in zip(PROMPTS, bonus)}
    seq_lens = torch.tensor(list(PROMPTS.values()))
    accepted = []

    def verify(verify_ids: torch.Tensor) -> VerifyRows:
        rows = forward(*_batch("verify", list(verify_ids), seq_lens.tolist(), True, q=K + 1))
        return VerifyRows(rows.next_token_logits, rows.hidden_states)

    while min(len(t) for t in tokens.values()) < NEW_TOKENS:
        step = speculative_step(contexts, list(PROMPTS), [RIDS[s] for s in PROMPTS], bonus, seq_lens, K, verify)
        for i, slot in enumerate(PROMPTS):
            tokens[slot] += step.out_tokens[i, :int(step.commit_lens[i])].tolist()
        accepted += step.correct_len.tolist()
        bonus, seq_lens = step.bonus, step.new_seq_lens
    return {slot: t[:NEW_TOKENS] for slot, t in tokens.items()}, accepted, contexts


@pytest.mark.parametrize("deterministic", [True, False], ids=["verify-by-row", "verify-in-one-forward"])
def test_with_an_oracle_drafter_every_accept_length_occurs_and_the_tokens_are_plain_greedy(model, plain, deterministic):
    """Both ways of running the verify rows (fp32: one forward of 1 + k rows rounds too little to flip these)."""
    sequences = {slot: _prompts(model.cfg)[slot].tolist() + plain[slot] for slot in PROMPTS}
    tokens, accepted, _ = _speculate(model, OracleDrafter(sequences, spoil=(0, 1, 2, 3, 3)), deterministic)
    assert tokens == plain
    assert set(accepted) == set(range(K + 1))


def test_with_the_dspark_drafter_the_tokens_are_plain_greedy(model, plain):
    drafter = DSparkDrafter(model)
    drafter.load_weights(random_drafter_weights(model.cfg, 11))
    tokens, accepted, contexts = _speculate(model, drafter)
    assert tokens == plain
    assert len(contexts) == len(PROMPTS) and all(0 <= a <= K for a in accepted)


def test_a_request_without_a_context_drafts_its_bonus_token_and_starts_one_from_the_verify_rows(model):
    contexts = DraftContexts(OracleDrafter({}, spoil=(9,)), model.cfg.dspark_target_layer_ids)
    assert contexts.draft(3, "new", anchor=17, pos=50, k=K) == (17, 17, 17)
    features = torch.zeros(K + 1, 3 * model.cfg.hidden_size)
    contexts.commit(3, "new", features, start=50, keep=52)
    contexts.observe(3, "other", features, 0)  # the slot's next request: a new context
    contexts.forget("other")
    assert len(contexts) == 0


def test_greedy_accept_follows_sglangs_rule():
    verify_ids = torch.tensor([[5, 1, 2, 3], [5, 9, 2, 3], [5, 1, 2, 3]])
    best = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 7, 4]])
    logits = torch.nn.functional.one_hot(best, 10).float().view(-1, 10)
    correct_len, bonus = accept_greedy(verify_ids, logits)
    assert correct_len.tolist() == [3, 0, 2] and bonus.tolist() == [4, 1, 7]
