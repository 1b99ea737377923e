"""asym-decode's mixed step on CPU, without servers: window rows riding in a decode forward compute what two forwards do.

Window rows queued with `ride_next_decode` run inside the next decode forward (`ReferenceForward.__call__`,
over an in-memory row store); the decode rows get exactly the logits they get alone, the rider gets its
rows' logits, and the pool ends byte for byte as after two separate forwards (deterministic mode: each
piece is a forward of its own). An extend forward leaves riders queued for a decode forward."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.sglang_plugin.cpu_platform import reference_forward
from sglang_asym.sglang_plugin.cpu_platform.reference_forward import (DEFAULT_SEMANTICS, RequestRows,
                                                                      ride_next_decode, take_unridden)
from sglang_plugin.whole_forward import ReferenceForward

from .memory_rows import MemoryRows, Mode

RUNNING, WINDOWED = 0, 1  # req slots: a request decoding, and one whose window is pending
RUNNING_LEN, WINDOWED_LEN, BOUNDARY = 40, 150, 22  # N = 150 > W = 128: B = 22, P's prefix [0, 22)


def _forward_batch(mode: str, rows: list[RequestRows]) -> SimpleNamespace:
    """The ForwardBatch fields the reference forward reads."""
    return SimpleNamespace(forward_mode=Mode(mode), batch_size=len(rows),
                           req_pool_indices=torch.tensor([r.req for r in rows]),
                           extend_seq_lens_cpu=[r.tokens.numel() for r in rows],
                           input_ids=torch.cat([r.tokens for r in rows]),
                           positions=torch.cat([torch.arange(r.start, r.end) for r in rows]))


@pytest.fixture(scope="module")
def model():
    return build("tiny", seed=5, cache_quant="release")


@pytest.fixture(autouse=True)
def prompt_lengths(monkeypatch):
    """The prompt lengths the init_new hook records; SGLang's LogitsProcessorOutput as a plain record (its
    module's imports need the CPU import stand-ins, which change sys.meta_path for the whole process)."""
    monkeypatch.setattr(reference_forward.RECORDS, "requests", {RUNNING: reference_forward.RequestRecord(RUNNING_LEN),
                                                                WINDOWED: reference_forward.RequestRecord(WINDOWED_LEN)})
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.logits_processor",
                        SimpleNamespace(LogitsProcessorOutput=SimpleNamespace))
    take_unridden()
    yield
    assert take_unridden() == []


def _started(model) -> tuple[ReferenceForward, MemoryRows, RequestRows, RequestRows]:
    """A forward whose pool holds the running request's prompt and the windowed request's prefix [0, B);
    returns it with the running request's next decode row and the window's first 32-row chunk."""
    rows = MemoryRows(model.cfg)
    forward = ReferenceForward(model, rows, DEFAULT_SEMANTICS, deterministic=True)
    running, windowed = prompt(model.cfg, RUNNING_LEN, 1), prompt(model.cfg, WINDOWED_LEN, 2)
    forward.run_rows([RequestRows(RUNNING, 0, running, RUNNING_LEN)])
    forward.run_rows([RequestRows(WINDOWED, 0, windowed[:BOUNDARY], WINDOWED_LEN)])
    decode = RequestRows(RUNNING, RUNNING_LEN, torch.tensor([7]), None)
    chunk = RequestRows(WINDOWED, BOUNDARY, windowed[BOUNDARY:BOUNDARY + 32], WINDOWED_LEN)
    return forward, rows, decode, chunk


def test_a_window_chunk_riding_in_a_decode_forward_computes_what_two_forwards_compute(model):
    forward, mixed_rows, decode, chunk = _started(model)
    ridden: list[torch.Tensor] = []
    ride_next_decode(_forward_batch("extend", [chunk]), ridden.append, work="the chunk")
    out = forward(decode.tokens, torch.tensor([decode.start]), _forward_batch("decode", [decode]))
    assert forward.forwards == 1 and len(ridden) == 1

    alone, separate_rows, decode, chunk = _started(model)
    chunk_logits, _, _ = alone.run_rows([chunk])
    decode_logits, _, _ = alone.run_rows([decode])

    assert out.next_token_logits.shape == (1, model.cfg.vocab_size)
    assert torch.equal(out.next_token_logits[0], decode_logits[0].float())
    assert ridden[0].shape == (1, model.cfg.vocab_size) and torch.equal(ridden[0][0], chunk_logits[0])
    assert mixed_rows.rows.keys() == separate_rows.rows.keys()
    assert all(torch.equal(mixed_rows.rows[k], separate_rows.rows[k]) for k in mixed_rows.rows)
    assert ("swa", model.cfg.num_hidden_layers - 1, WINDOWED, BOUNDARY + 31) in mixed_rows.rows  # the chunk's rows reached the pool


def test_an_extend_forward_leaves_riders_for_a_decode_forward(model):
    forward, _, _, chunk = _started(model)
    ridden: list[torch.Tensor] = []
    rider = ride_next_decode(_forward_batch("extend", [chunk]), ridden.append, work="the chunk")
    assert [(r.req, r.start, r.end, r.prompt_len) for r in rider.rows] == [(WINDOWED, BOUNDARY, BOUNDARY + 32, WINDOWED_LEN)]
    more = RequestRows(RUNNING, RUNNING_LEN, torch.tensor([7, 8]), RUNNING_LEN + 2)
    forward(more.tokens, torch.arange(RUNNING_LEN, RUNNING_LEN + 2), _forward_batch("extend", [more]))
    assert ridden == []
    left = take_unridden()
    assert [r.work for r in left] == ["the chunk"]
