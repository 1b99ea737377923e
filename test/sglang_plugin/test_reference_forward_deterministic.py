"""`--enable-deterministic-inference` in SGLang's engine on CPU, without servers: the reference forward over a
pool (`ReferenceForward.run_rows`, here over an in-memory row store that round-trips the same release formats
as SGLang's pool) gives a request the same logits alone and inside mixed extend / decode batches, bit for bit,
only in deterministic mode; and the flag's SGLang-side changes (deterministic.py) do what they say."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.sglang_plugin.cpu_platform import deterministic
from sglang_asym.sglang_plugin.cpu_platform.reference_forward import (DEFAULT_SEMANTICS, RequestRows, WindowSplit,
                                                                      pieces)
from sglang_asym.sglang_plugin.cpu_platform.layer_loop import LayerForward
from sglang_plugin.whole_forward import ReferenceForward
from sglang_asym.sglang_plugin.shared.settings import AsymSettings

from .memory_rows import MemoryRows


@pytest.fixture(scope="module")
def model():
    return build("tiny", seed=5, cache_quant="release")


TARGET, TARGET_LEN, DECODE_STEPS = 0, 150, 3  # N = 150 > W = 128: prefix [0, 22), then the window in pieces
OTHERS = {1: 40, 2: 129, 3: 7}  # req slot: prompt length (a second window among them)


def _serve(model, deterministic_mode: bool, batched: bool) -> list[torch.Tensor]:
    """The target's logits at its prompt's last row and at each decode step, alone or beside the others
    (their prompts in the same extend batch, their decode rows in the same decode batches)."""
    forward = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS, deterministic_mode)
    prompts = {TARGET: prompt(model.cfg, TARGET_LEN, 1)}
    if batched:
        prompts.update({slot: prompt(model.cfg, n, 10 + slot) for slot, n in OTHERS.items()})
    extend = [RequestRows(slot, 0, tokens, tokens.numel()) for slot, tokens in prompts.items()]
    logits, _, _ = forward.run_rows(extend)
    seen = [logits[0]]
    for step in range(DECODE_STEPS):
        decode = [RequestRows(slot, tokens.numel() + step, torch.tensor([int(out.argmax())]), None)
                  for (slot, tokens), out in zip(prompts.items(), logits)]
        logits, _, _ = forward.run_rows(decode)
        seen.append(logits[0])
    return seen


def test_batched_logits_equal_alone_only_in_deterministic_mode(model):
    alone, batched = _serve(model, False, False), _serve(model, False, True)
    assert not all(torch.equal(a, b) for a, b in zip(alone, batched))  # the batch changed the last bits
    alone, batched = _serve(model, True, False), _serve(model, True, True)
    assert all(torch.equal(a, b) for a, b in zip(alone, batched))
    assert len(alone) == 1 + DECODE_STEPS


def test_deterministic_forward_runs_each_piece_alone(model):
    rows = [RequestRows(0, 0, prompt(model.cfg, 150, 1), 150), RequestRows(1, 0, prompt(model.cfg, 5, 2), 5)]
    phase = [(0, rows[0], {}), (1, rows[1], {})]
    on = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS, True)
    off = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS, False)
    assert on.forward_groups(phase) == [[phase[0]], [phase[1]]]
    assert off.forward_groups(phase) == [phase]


def _exec(enabled: bool):
    return SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=enabled))


def test_prefill_chunks_align_to_the_chunk_size_only_when_deterministic(monkeypatch):
    for enabled, chunk, expected in ((True, 4096, 4096), (False, 4096, None), (True, None, None), (True, -1, None)):
        monkeypatch.setattr(deterministic, "deterministic_inference", lambda enabled=enabled: enabled)
        scheduler = SimpleNamespace(chunked_prefill_size=chunk, truncation_align_size=None)
        deterministic.align_prefill_chunks(None, scheduler)
        assert scheduler.truncation_align_size == expected, (enabled, chunk)


def _runner_with_layer_loop(deterministic_loop: bool) -> SimpleNamespace:
    """A model runner whose causal LM's first layer computes through a (stand-in) layer loop."""
    loop = SimpleNamespace(setup=SimpleNamespace(deterministic=deterministic_loop))
    layer = SimpleNamespace(forward_hc_pre_from_prev=LayerForward(loop, 0, None))
    return SimpleNamespace(model=SimpleNamespace(model=SimpleNamespace(layers=[layer], start_layer=0)))


def test_the_model_runner_check_refuses_a_forward_that_is_not_batch_invariant(monkeypatch):
    monkeypatch.setattr(deterministic, "deterministic_inference", lambda: True)
    deterministic.check_batch_invariant_forward(_runner_with_layer_loop(True))
    with pytest.raises(ValueError, match="needs the DeepSeek-V4.1 reference layers; SimpleNamespace does not run them"):
        deterministic.check_batch_invariant_forward(_runner_with_layer_loop(False))
    plain = SimpleNamespace(model=torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="needs the DeepSeek-V4.1 reference layers; Linear does not run them"):
        deterministic.check_batch_invariant_forward(plain)
    monkeypatch.setattr(deterministic, "deterministic_inference", lambda: False)
    deterministic.check_batch_invariant_forward(plain)  # flag off: nothing to check


def test_the_patch_table_targets_and_the_launcher_choice():
    assert [(p.target, p.kind, p.process) for p in deterministic.DETERMINISTIC_PATCHES] == [
        ("sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode", "REPLACE",
         "scheduler"),
        ("sglang.srt.managers.scheduler.Scheduler.init_deterministic_inference_config", "AFTER", "scheduler")]
    assert deterministic.deterministic_patches("scheduler") == list(deterministic.DETERMINISTIC_PATCHES)
    from sglang.srt.arg_groups.choices import DETERMINISTIC_ATTENTION_BACKEND_CHOICES

    before = list(DETERMINISTIC_ATTENTION_BACKEND_CHOICES)
    try:
        assert deterministic.deterministic_patches("launcher") == []
        assert DETERMINISTIC_ATTENTION_BACKEND_CHOICES.count("dsv4") == 1
        deterministic.allow_deterministic_backend()  # idempotent
        assert DETERMINISTIC_ATTENTION_BACKEND_CHOICES.count("dsv4") == 1
    finally:
        DETERMINISTIC_ATTENTION_BACKEND_CHOICES[:] = before  # SGLang's list is process-wide


def test_the_window_split_is_the_servers_settings():
    cfg = None  # the settings alone decide; only a symmetric server reads the model's window
    assert WindowSplit.of(AsymSettings("asym-decode", window=128, window_chunk=48), cfg) == WindowSplit(128, 48)
    assert WindowSplit.of(AsymSettings("asym-decode", window=128, window_chunk=0), cfg) == WindowSplit(128, 128)
    assert WindowSplit.of(AsymSettings("asym-prefill", window=128), cfg) == WindowSplit(128, 32)
    assert WindowSplit.of(None, SimpleNamespace(sliding_window=128)) == WindowSplit(128, 32)
    with pytest.raises(ValueError, match=r"WindowSplit.chunk must be in \[1, window=128\], got 129"):
        WindowSplit(128, 129)


def test_a_window_in_48_row_chunks_computes_as_the_decode_roles_48_row_steps(model):
    """--asym-window-chunk 48: the reference forward cuts a prompt's window on the grid B + 48k, the rows D's
    window steps hand it, so one extend of the whole prompt equals the prefix and then 48-row steps, bit for bit."""
    window = model.cfg.sliding_window
    split = WindowSplit.of(AsymSettings("asym-decode", window=window, window_chunk=48), model.cfg)
    n = window + 72
    boundary = n - window
    tokens = prompt(model.cfg, n, 3)
    grid = [(r.start, r.end) for r, _ in pieces(RequestRows(0, 0, tokens, n), model.cfg, window, DEFAULT_SEMANTICS, 48)]
    steps = [(0, boundary), *[(s, min(s + 48, n)) for s in range(boundary, n, 48)]]
    assert grid == steps == [(0, 72), (72, 120), (120, 168), (168, 200)]
    whole = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS, True, split)
    (expected,), _, _ = whole.run_rows([RequestRows(0, 0, tokens, n)])
    stepped = ReferenceForward(model, MemoryRows(model.cfg), DEFAULT_SEMANTICS, True, split)
    for start, end in steps:
        (last,), _, _ = stepped.run_rows([RequestRows(0, start, tokens[start:end], n)])
    assert torch.equal(last, expected)
