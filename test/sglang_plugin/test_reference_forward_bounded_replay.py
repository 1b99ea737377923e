"""SGLang's decoder SWA bounded replay in the CPU route's reference forward, without servers (over an in-memory row
store that round-trips SGLang's pool formats): a full model's prompt rows before B = N - W run only the layers
before the last KV source and that layer's KV path, the rows from B on every layer; logits and every row a later
step reads equal full compute's (SGLANG_ASYM_FULL_COMPUTE=1) bit for bit, over SGLang's chunks too; the late
layers' window rows below B are never written; the forward log names each pass's layers and rows."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.sglang_plugin.cpu_platform import reference_forward
from sglang_asym.sglang_plugin.cpu_platform.reference_forward import DEFAULT_SEMANTICS, RequestRecord, RequestRows
from sglang_plugin.whole_forward import ReferenceForward
from sglang_asym.sglang_plugin.cpu_platform.replay_mode import FULL_COMPUTE_ENV, ReplayMode
from sglang_asym.sglang_plugin.shared.pool_dump import FORWARD_LOG_ENV
from sglang_asym.split import Semantics

from .memory_rows import MemoryRows, Mode

DECODE_STEPS = 3
FULL = ReplayMode(bounded=False)


@pytest.fixture(scope="module")
def model():
    return build("tiny", seed=5, cache_quant="release")


def _layers(model, upto: int | None = None) -> tuple[int, ...]:
    return tuple(range(model.cfg.num_hidden_layers if upto is None else upto + 1))


def _serve(model, replay: ReplayMode, prompts: dict[int, torch.Tensor], chunks: tuple[int, ...] = (),
           deterministic: bool = False) -> tuple[ReferenceForward, MemoryRows, list[list[torch.Tensor | None]]]:
    """Each prompt extended over SGLang's chunks (cut at `chunks`), all requests in the same extend forwards, then
    DECODE_STEPS greedy decode forwards; the logits of every forward."""
    rows = MemoryRows(model.cfg)
    forward = ReferenceForward(model, rows, DEFAULT_SEMANTICS, deterministic, replay=replay)
    seen = []
    cuts = lambda n: [0, *[c for c in chunks if c < n], n]  # noqa: E731
    for k in range(max(len(cuts(t.numel())) - 1 for t in prompts.values())):
        extend = [RequestRows(slot, cuts(t.numel())[k], t[cuts(t.numel())[k]:cuts(t.numel())[k + 1]], t.numel())
                  for slot, t in prompts.items() if k < len(cuts(t.numel())) - 1]
        logits, _, _ = forward.run_rows(extend)
        seen.append(logits)
    last = seen[-1]
    for step in range(DECODE_STEPS):
        decode = [RequestRows(slot, t.numel() + step, torch.tensor([int(out.argmax())]), None)
                  for (slot, t), out in zip(prompts.items(), last)]
        last, _, _ = forward.run_rows(decode)
        seen.append(last)
    return forward, rows, seen


def _equal(a: list[list[torch.Tensor | None]], b: list[list[torch.Tensor | None]]) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) and all(
        (p is None and q is None) or (p is not None and q is not None and torch.equal(p, q)) for p, q in zip(x, y))
        for x, y in zip(a, b))


def _late_window_rows(model, rows: MemoryRows, req: int) -> set[int]:
    last = model.plan.last_kv_source
    return {key[3] for key in rows.rows if key[0] == "swa" and key[1] >= last and key[2] == req}


@pytest.mark.parametrize("n", [1, 127, 128, 129, 150, 300])
def test_one_request_equals_full_compute_bit_for_bit(model, n):
    tokens = prompt(model.cfg, n, seed=n)
    bounded, bounded_rows, got = _serve(model, ReplayMode(), {0: tokens})
    full, full_rows, want = _serve(model, FULL, {0: tokens})
    assert _equal(got, want)
    boundary = max(n - model.cfg.sliding_window, 0)
    # every row a later step reads: the early layers' window rows, every compressed row, index key and pending token
    early = {k for k in full_rows.rows if not (k[0] == "swa" and k[1] >= model.plan.last_kv_source)}
    assert early == {k for k in bounded_rows.rows if not (k[0] == "swa" and k[1] >= model.plan.last_kv_source)}
    assert all(torch.equal(bounded_rows.rows[k], full_rows.rows[k]) for k in early)
    # the late layers' window rows: from B on only (full compute also wrote the prefix chunk's last window)
    assert min(_late_window_rows(model, bounded_rows, 0)) == boundary
    assert min(_late_window_rows(model, full_rows, 0)) < boundary or boundary == 0
    assert [layers for layers, _ in bounded.last_pieces] == [_layers(model)]  # a decode step runs every layer


def test_passes_run_the_late_layers_on_the_window_rows_only(model):
    n = 300
    boundary = n - model.cfg.sliding_window  # 172
    tokens = prompt(model.cfg, n, seed=1)
    forward = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS)
    forward.run_rows([RequestRows(0, 0, tokens, n)])
    passes = [(layers, [(r.start, r.end) for r in on]) for layers, on in forward.last_pieces]
    window = [(layers, rows) for layers, rows in passes[1:]]
    assert passes[0] == (_layers(model, model.plan.last_kv_source), [(0, boundary)])
    assert window == [(_layers(model), [(s, min(s + 32, n))]) for s in range(boundary, n, 32)]
    full = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS, replay=FULL)
    full.run_rows([RequestRows(0, 0, tokens, n)])
    assert [(layers, [(r.start, r.end) for r in on]) for layers, on in full.last_pieces][0] == \
        (_layers(model), [(0, boundary)])


def test_sglang_chunks_before_b_run_to_the_kv_source_and_equal_full_compute(model):
    """SGLang's chunked prefill: [0, 100) lies before B = 172 (no head ran: None), [100, 300) crosses it."""
    tokens = prompt(model.cfg, 300, seed=2)
    bounded, bounded_rows, got = _serve(model, ReplayMode(), {0: tokens}, chunks=(100,))
    full, _, want = _serve(model, FULL, {0: tokens}, chunks=(100,))
    assert got[0] == [None] and want[0][0] is not None
    assert _equal(got[1:], want[1:])
    assert min(_late_window_rows(model, bounded_rows, 0)) == 172


def test_a_batch_of_requests_equals_full_compute_in_deterministic_mode(model):
    prompts = {slot: prompt(model.cfg, n, seed=10 + slot) for slot, n in {0: 150, 1: 40, 2: 129, 3: 300}.items()}
    bounded, bounded_rows, got = _serve(model, ReplayMode(), prompts, chunks=(64,), deterministic=True)
    _, _, want = _serve(model, FULL, prompts, chunks=(64,), deterministic=True)
    assert [out is None for out in got[0]] == [False, False, False, True]  # [0, 64) of N = 300 lies before B
    got[0][3] = want[0][3]
    assert _equal(got, want)
    assert {slot: min(_late_window_rows(model, bounded_rows, slot)) for slot in prompts} == {0: 22, 1: 0, 2: 1, 3: 172}


def test_which_pieces_stop_at_the_kv_source(model):
    forward = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS)
    prefix, window = RequestRows(0, 0, torch.zeros(22, dtype=torch.long), 150), \
        RequestRows(0, 22, torch.zeros(32, dtype=torch.long), 150)
    short = RequestRows(1, 0, torch.zeros(40, dtype=torch.long), 40)  # N <= W: no prefix
    assert [forward.to_kv_source_only(r) for r in (prefix, window, short)] == [True, False, False]
    assert not forward.to_kv_source_only(prefix, capture=(6,))  # a drafter reads late-layer inputs of every row
    assert not forward.to_kv_source_only(RequestRows(0, 0, prefix.tokens, None))  # decode rows
    assert not forward.to_kv_source_only(RequestRows(0, 0, prefix.tokens, 150, verify=True))
    phase = [(0, prefix, {}), (1, short, {})]
    assert forward.forward_groups(phase) == [[phase[0]], [phase[1]]]
    assert forward.forward_groups(phase, capture=(6,)) == [phase]
    assert ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS, replay=FULL).forward_groups(phase) == [phase]
    # exact semantics has no floors: the late layers read the prefix's window rows, so they must be computed
    assert not ReferenceForward(model, MemoryRows(model.cfg), Semantics.EXACT).to_kv_source_only(prefix)
    prefill = build("tiny", seed=5, cache_quant="release", role="prefill")
    assert ReferenceForward(prefill, MemoryRows(model.cfg), DEFAULT_SEMANTICS).replay == FULL


def test_full_compute_switch() -> None:
    assert ReplayMode.from_environment({}) == ReplayMode(True)
    assert ReplayMode.from_environment({FULL_COMPUTE_ENV: "0"}).label == "bounded-replay"
    assert ReplayMode.from_environment({FULL_COMPUTE_ENV: "1"}) == FULL and FULL.label == "full-compute"
    with pytest.raises(ValueError, match="SGLANG_ASYM_FULL_COMPUTE must be 1 .* got 'yes'"):
        ReplayMode.from_environment({FULL_COMPUTE_ENV: "yes"})


def test_an_extend_before_b_returns_placeholder_logits_and_logs_its_pass(model, monkeypatch, tmp_path):
    """Through __call__ (SGLang's ForwardBatch fields): a chunk of a prompt that ends before B ran no head; SGLang
    discards a chunked prompt's sample, so its logits row is zeros; the forward log names the pass."""
    monkeypatch.setattr(reference_forward.RECORDS, "requests", {0: RequestRecord(300, room=7)})
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.logits_processor",
                        SimpleNamespace(LogitsProcessorOutput=SimpleNamespace))
    log = tmp_path / "forwards.jsonl"
    monkeypatch.setenv(FORWARD_LOG_ENV, str(log))
    tokens = prompt(model.cfg, 300, seed=2)
    forward = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS)
    for start, end in ((0, 100), (100, 300)):
        batch = SimpleNamespace(forward_mode=Mode("extend"), batch_size=1, req_pool_indices=torch.tensor([0]),
                                extend_seq_lens_cpu=[end - start], input_ids=tokens[start:end],
                                positions=torch.arange(start, end))
        out = forward(batch.input_ids, batch.positions, batch)
        assert out.next_token_logits.shape == (1, model.cfg.vocab_size)
        assert out.next_token_logits.any() == (end == 300)
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    early, every = list(_layers(model, model.plan.last_kv_source)), list(_layers(model))
    assert first["layers"] == early and first["pieces"] == [{"layers": early, "rows": [[7, 0, 100]]}]
    assert second["rows"] == [[7, 100, 300]] and second["layers"] == every
    assert second["pieces"] == [{"layers": early, "rows": [[7, 100, 172]]}] + \
        [{"layers": every, "rows": [[7, s, min(s + 32, 300)]]} for s in range(172, 300, 32)]
