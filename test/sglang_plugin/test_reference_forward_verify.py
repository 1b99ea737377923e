"""The reference forward's speculative verify batch (SGLang's TARGET_VERIFY) on CPU, without servers.

A verify batch holds 1 + k rows per request (the last accepted token and k drafts) at positions s..s+k.
Its logits are every row's, request after request, and equal the logits of k + 1 one-row decode steps
(same argmax; the values to float rounding, since one forward of 4 rows and four forwards of 1 row round
differently). Which drafts are accepted is known only after the forward, so each odd accepted length
must find its pending compressor token in the pool: a decode step after any accept length computes what
plain decoding computes at that position."""

from __future__ import annotations

import copy
import sys
from types import SimpleNamespace

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.sglang_plugin.cpu_platform import reference_forward
from sglang_asym.sglang_plugin.cpu_platform.reference_forward import DEFAULT_SEMANTICS, RequestRows
from sglang_plugin.whole_forward import ReferenceForward

from .memory_rows import MemoryRows, Mode

ODD, EVEN = 0, 1  # req slots: prompts of 41 tokens (a pending pair token at 40) and 40 tokens
PROMPTS = {ODD: 41, EVEN: 40}
ROWS = 4  # 1 + k, k = 3 drafts
TOLERANCE = 1e-4  # max |difference| between a verify row's logits and the one-row decode's


def _batch(mode: str, rows: list[RequestRows]) -> tuple[torch.Tensor, torch.Tensor, SimpleNamespace]:
    """(input_ids, positions, the ForwardBatch fields the reference forward reads)."""
    input_ids = torch.cat([r.tokens for r in rows])
    positions = torch.cat([torch.arange(r.start, r.end) for r in rows])
    return input_ids, positions, SimpleNamespace(
        forward_mode=Mode(mode), batch_size=len(rows), req_pool_indices=torch.tensor([r.req for r in rows]),
        spec_info=SimpleNamespace(draft_token_num=ROWS))


@pytest.fixture(scope="module")
def model():
    return build("tiny", seed=5, cache_quant="release")


def _plain_records(patch: pytest.MonkeyPatch) -> None:
    """The prompt lengths the init_new hook records; SGLang's LogitsProcessorOutput as a plain record (its
    module's imports need the CPU import stand-ins)."""
    patch.setattr(reference_forward.RECORDS, "requests", {slot: reference_forward.RequestRecord(n) for slot, n in PROMPTS.items()})
    patch.setitem(sys.modules, "sglang.srt.layers.logits_processor",
                  SimpleNamespace(LogitsProcessorOutput=SimpleNamespace))


@pytest.fixture(autouse=True)
def plain_records(monkeypatch):
    _plain_records(monkeypatch)


def _sequences(cfg) -> dict[int, torch.Tensor]:
    """Each request's prompt and the ROWS + 1 tokens that follow it."""
    return {req: prompt(cfg, n + ROWS + 1, seed=req + 3) for req, n in PROMPTS.items()}


def _prefilled(model, deterministic: bool = False) -> tuple[ReferenceForward, MemoryRows]:
    rows = MemoryRows(model.cfg)
    forward = ReferenceForward(model, rows, DEFAULT_SEMANTICS, deterministic=deterministic)
    for req, tokens in _sequences(model.cfg).items():
        forward.run_rows([RequestRows(req, 0, tokens[:PROMPTS[req]], PROMPTS[req])])
    return forward, rows


def _decode(forward: ReferenceForward, req: int, position: int, token: int) -> torch.Tensor:
    out = forward(*_batch("decode", [RequestRows(req, position, torch.tensor([token]), None)]))
    return out.next_token_logits[0]


@pytest.fixture(scope="module")
def plain(model) -> dict[int, list[torch.Tensor]]:
    """One-row decode logits at positions n .. n + ROWS of each request (plain decoding, no drafts)."""
    with pytest.MonkeyPatch.context() as patch:
        _plain_records(patch)
        forward, _ = _prefilled(model, deterministic=True)
        return {req: [_decode(forward, req, n + j, int(tokens[n + j])) for j in range(ROWS + 1)]
                for (req, tokens), n in zip(_sequences(model.cfg).items(), PROMPTS.values())}


def _verified(model, deterministic: bool = False) -> tuple[ReferenceForward, MemoryRows, torch.Tensor]:
    forward, rows = _prefilled(model, deterministic)
    verify = [RequestRows(req, PROMPTS[req], tokens[PROMPTS[req]:PROMPTS[req] + ROWS], None)
              for req, tokens in _sequences(model.cfg).items()]
    return forward, rows, forward(*_batch("verify", verify)).next_token_logits


def test_a_verify_batch_gives_every_rows_logits_as_one_row_decode_steps_do(model, plain):
    _, _, logits = _verified(model)
    assert logits.shape == (len(PROMPTS) * ROWS, model.cfg.vocab_size) and logits.dtype == torch.float32
    for i, req in enumerate(PROMPTS):
        for j in range(ROWS):
            row = logits[i * ROWS + j]
            assert int(row.argmax()) == int(plain[req][j].argmax()), (req, j)
            assert float((row - plain[req][j]).abs().max()) < TOLERANCE, (req, j)


def test_deterministic_inference_verifies_row_by_row_exactly_as_one_row_decode_steps(model, plain):
    """--enable-deterministic-inference: each verify row is a forward of its own, bit for bit a decode step."""
    _, _, logits = _verified(model, deterministic=True)
    for i, req in enumerate(PROMPTS):
        for j in range(ROWS):
            assert torch.equal(logits[i * ROWS + j], plain[req][j].float()), (req, j)


@pytest.mark.parametrize("accepted", range(ROWS))
def test_after_any_accept_length_the_next_step_decodes_as_plain_decoding(model, plain, accepted):
    """`accepted` drafts of 3 kept: the sequence ends at n + 1 + accepted, odd for one of the two requests
    whatever `accepted` is, and the next decode step reads that length's pending pair token from the pool."""
    forward, rows, _ = _verified(model)
    kept = copy.deepcopy(rows.rows)  # rows past the kept length stay in the pool, as in SGLang's: never read
    sequences = _sequences(model.cfg)
    for req, n in PROMPTS.items():
        rows.rows = copy.deepcopy(kept)
        end = n + 1 + accepted
        if end % 2:
            for owner in (o for o, r in rows.ratio.items() if r == 2):
                assert ("tail", owner, req, end - 1) in rows.rows  # the pending token of this accept length
        logits = _decode(forward, req, end, int(sequences[req][end]))
        assert int(logits.argmax()) == int(plain[req][1 + accepted].argmax()), (req, accepted)
        assert float((logits - plain[req][1 + accepted]).abs().max()) < TOLERANCE, (req, accepted)


def test_a_verify_batch_of_uneven_rows_is_refused(model):
    forward, _ = _prefilled(model)
    rows = [RequestRows(ODD, 41, torch.tensor([1, 2, 3]), None)]
    with pytest.raises(RuntimeError, match="1 requests x 4 rows holds 3 tokens"):
        forward(*_batch("verify", rows))
