"""The graph runner on CUDA: whole-forward decode graphs (batch bucket x (1 + k) x context) and
segment graphs for a 128-row window bucket and a breakable mixed step, captured and replayed, equal
eager execution (and the emulated graph path, which runs the same decode function uncaptured) and
the reference model, and leave the same caches; the reference model on CUDA matches it on CPU.
Needs a GPU."""

from __future__ import annotations

import pytest
import torch

from model.graph_runner_helpers import SIZING, assert_same_caches, max_diff, same_argmax, step_both, twins
from model.helpers import build, prompt, weights
from sglang_asym.asym import install_prefix, run_prefix_on_full_model
from sglang_asym.cache import CacheSizing
from sglang_asym.config import V41Config
from sglang_asym.model import V41Model
from sglang_asym.model.graph_runner import GraphRunner, RowKind, StepRows
from sglang_asym.sched import ForwardKind, GraphChoice, GraphConfig, GraphKind, SchedulerConfig
from sglang_asym.split import SplitPlan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

D, W = RowKind.DECODE, RowKind.WINDOW
GRAPHS = GraphConfig(decode_batch_sizes=(1, 2, 4, 8), window_row_bucket=128, max_window_graph_rows=512,
                     mixed_row_buckets=(32, 64, 128, 256))
SPEC = SchedulerConfig(num_draft_tokens=3, max_running=8, token_budget=512, graphs=GRAPHS)  # verify width 4


def cuda_model(dtype: str | None = None, seed: int = 1, cache_quant: str = "none") -> V41Model:
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 comparisons need full-precision matmuls
    torch.backends.cudnn.allow_tf32 = False
    model = V41Model(V41Config.preset("tiny"), dtype=dtype, device="cuda", cache_quant=cache_quant)
    model.load_weights({k: v for k, v in weights("tiny", seed).items() if k in model.expected_tensor_names()})
    return model


@pytest.fixture(scope="module")
def model():
    return cuda_model()


def graph_and_eager_step(t, graph: GraphRunner, eager: GraphRunner, tokens, kinds):
    """The same step through the graph runner (t.run caches) and the eager runner (t.ref caches)."""
    got = graph.run([StepRows(c, tok, k) for c, tok, k in zip(t.run, tokens, kinds)])
    want = eager.run([StepRows(c, tok, k) for c, tok, k in zip(t.ref, tokens, kinds)])
    assert got.choice == want.choice
    return got, want


@pytest.mark.parametrize("batch", [1, 2, 3, 8])
def test_decode_bucket_replay_equals_eager(model, batch):
    t = twins(model, [40 + 13 * i for i in range(batch)])
    graph, eager = GraphRunner(model, SPEC), GraphRunner(model, SPEC, backend="eager", moe="static")
    assert graph.backend.value == "cuda_graph"
    for step in range(4):
        q_lens = [4] * batch if step % 2 else [1 + (step + i) % 4 for i in range(batch)]
        tokens = [prompt(model.cfg, q, seed=1000 * batch + 10 * step + i) for i, q in enumerate(q_lens)]
        got, want = graph_and_eager_step(t, graph, eager, tokens, [D] * batch)
        assert got.choice.kind is GraphKind.FULL and got.choice.padded_shape[1] == 4
        assert max_diff(got.logits, want.logits) <= 1e-5 and same_argmax(got.logits, want.logits)
        for a, b in zip(t.run, t.ref):
            assert_same_caches(a, b, tol=1e-5)
    stats = graph.stats()
    assert stats.graph_forwards == 4 and stats.eager_forwards == 0 and stats.eager_segment_calls == 0
    # one whole-forward graph per (bucket, 4, context capacity): the context passes 64 or 128 at most once
    assert stats.graph_captures == stats.captured_shapes and 1 <= stats.graph_captures <= 2
    assert stats.graph_replays == 4
    t.release()


def test_decode_graph_with_release_cache_formats():
    """The served formats (FP8 window KV, NVFP4 compressed rows, MXFP4 index keys/queries) quantized
    inside the captured graph (no host-side refusals there) agree with the eager runner, whose quantizer
    refuses non-finite rows on the host (same bits for finite rows; a value within ~1e-7 of an FP4
    boundary may round the other way under another summation order, hence 1e-3 and the same argmax)."""
    quant = cuda_model(cache_quant="release")
    t = twins(quant, [40, 57, 129])
    graph, eager = GraphRunner(quant, SPEC), GraphRunner(quant, SPEC, backend="eager", moe="static")
    assert graph.whole_decode_graphs
    for step, q_lens in enumerate(([4, 2, 1], [1, 3, 4], [2, 2, 2])):
        tokens = [prompt(quant.cfg, q, seed=1200 + 10 * step + i) for i, q in enumerate(q_lens)]
        got, want = graph_and_eager_step(t, graph, eager, tokens, [D] * 3)
        assert got.choice.kind is GraphKind.FULL
        assert max_diff(got.logits, want.logits) <= 1e-3 and same_argmax(got.logits, want.logits)
    assert [c.pos for c in t.run] == [c.pos for c in t.ref] == [47, 64, 136]
    stats = graph.stats()
    assert (stats.graph_forwards, stats.eager_segment_calls, stats.graph_replays) == (3, 0, 3)
    t.release()


def test_replay_reads_new_inputs(model):
    """A replayed graph computes from this step's data, not the data it was captured with."""
    t = twins(model, [50, 61])
    graph, eager = GraphRunner(model, SPEC), GraphRunner(model, SPEC, backend="eager", moe="static")
    for step in range(3):
        tokens = [prompt(model.cfg, 2, seed=50 + 7 * step + i) for i in range(2)]
        got, want = graph_and_eager_step(t, graph, eager, tokens, [D, D])
        assert max_diff(got.logits, want.logits) <= 1e-5
        if step:
            assert not torch.equal(got.logits[0], previous)
        previous = got.logits[0].clone()
    t.release()


@pytest.mark.parametrize("window_rows", [[128], [70, 58], [50, 40, 60]])
def test_window_row_bucket_replay_equals_eager(model, window_rows):
    t = twins(model, [30 + 20 * i for i in range(len(window_rows))])
    graph, eager = GraphRunner(model, SPEC), GraphRunner(model, SPEC, backend="eager", moe="static")
    for step in range(2):
        tokens = [prompt(model.cfg, n, seed=2000 + 10 * step + i) for i, n in enumerate(window_rows)]
        got, want = graph_and_eager_step(t, graph, eager, tokens, [W] * len(window_rows))
        expected = 128 if sum(window_rows) <= 128 else 256
        assert (got.choice.kind, got.choice.padded_shape) == (GraphKind.ROW_BUCKET, (expected,))
        assert max_diff(got.logits, want.logits) <= 1e-5 and same_argmax(got.logits, want.logits)
    t.release()


def test_mixed_breakable_replay_equals_eager(model):
    t = twins(model, [64, 90, 10])
    graph, eager = GraphRunner(model, SPEC), GraphRunner(model, SPEC, backend="eager", moe="static")
    tokens = [prompt(model.cfg, n, seed=3000 + i) for i, n in enumerate([4, 1, 32])]
    got, want = graph_and_eager_step(t, graph, eager, tokens, [D, D, W])
    assert (got.choice.forward, got.choice.kind, got.choice.padded_shape) == (
        ForwardKind.MIXED, GraphKind.BREAKABLE, (64,))
    assert max_diff(got.logits, want.logits) <= 1e-5 and same_argmax(got.logits, want.logits)
    t.release()


def test_graph_runner_equals_reference_model(model):
    t = twins(model, [33, 70, 129])
    graph = GraphRunner(model, SPEC)
    for step in range(3):
        tokens = [prompt(model.cfg, q, seed=4000 + 10 * step + i) for i, q in enumerate([4, 1, 3])]
        out, ref = step_both(t, graph, tokens, [D] * 3)
        assert max_diff(out.logits, ref) <= 1e-4 and same_argmax(out.logits, ref)
    t.release()


def test_prepared_buckets_only_replay(model):
    t = twins(model, [20, 21, 22, 23])
    before = {name: pool.storage.clone() for name, pool in t.run[0].set.pools.items()}
    graph = GraphRunner(model, SPEC)
    for batch in GRAPHS.decode_batch_sizes:  # whole-forward decode graphs over t.run's pools, context 64
        graph.prepare(GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 1, 1, (batch, 4)), logit_rows=batch * 4,
                      cache_set=t.run[0].set, context=27)
    graph.prepare(GraphChoice(ForwardKind.WINDOW, GraphKind.ROW_BUCKET, 1, 1, (128,)), logit_rows=1)
    captured = graph.stats().graph_captures
    assert captured == len(GRAPHS.decode_batch_sizes) + model.cfg.num_hidden_layers + 2
    for name, pool in t.run[0].set.pools.items():  # capturing all-padding steps wrote no stored row
        assert torch.equal(pool.storage, before[name]), name
    tokens = [prompt(model.cfg, 4, seed=i) for i in range(4)]
    out, ref = step_both(t, graph, tokens, [D] * 4)
    assert max_diff(out.logits, ref) <= 1e-4 and same_argmax(out.logits, ref)
    out, ref = step_both(t, graph, [prompt(model.cfg, 30, seed=9)], [W])
    assert max_diff(out.logits, ref) <= 1e-4
    assert graph.stats().graph_captures == captured
    t.release()


def test_decode_graph_replay_equals_uncaptured_decode_function(model):
    """Capture + replay of the whole-forward decode graph against the same function run uncaptured
    (backend 'emulated_graph' on CUDA): the same kernels give the same logits and caches, step after
    step (short verifies, a padded slot, odd and even starts, the window passing 128)."""
    tol = 1e-5
    t = twins(model, [117, 64, 201])
    graph, emulated = GraphRunner(model, SPEC), GraphRunner(model, SPEC, backend="emulated_graph")
    for step, q_lens in enumerate(([4, 1, 2], [3, 4, 4], [1, 1, 1], [2, 3, 4], [4, 4, 1])):
        tokens = [prompt(model.cfg, q, seed=6000 + 10 * step + i) for i, q in enumerate(q_lens)]
        got, want = graph_and_eager_step(t, graph, emulated, tokens, [D] * 3)
        assert got.choice.padded_shape == (4, 4)
        assert max_diff(got.logits, want.logits) <= tol
        for a, b in zip(t.run, t.ref):
            assert_same_caches(a, b, tol=tol)
    assert graph.stats().graph_replays == 5 and emulated.stats().graph_replays == 5
    t.release()


def test_bf16_replay_equals_eager():
    model = cuda_model(dtype="bfloat16")
    t = twins(model, [45, 80])
    graph, eager = GraphRunner(model, SPEC), GraphRunner(model, SPEC, backend="eager", moe="static")
    for step in range(2):
        tokens = [prompt(model.cfg, 4, seed=5000 + 10 * step + i) for i in range(2)]
        got, want = graph_and_eager_step(t, graph, eager, tokens, [D, D])
        # bf16 caches: the graph's static attention sums in another order than the eager one, and a
        # rounding flip in a stored bf16 row moves later logits by a few 1e-2 (on CPU: <= 0.05)
        assert max_diff(got.logits, want.logits) <= 0.1
    t.release()


def test_reference_model_cuda_matches_cpu(model):
    """The reference model itself on CUDA against CPU (fp32): prefill logits and greedy decode."""
    cpu = build("tiny", seed=1)
    tokens = prompt(cpu.cfg, 150, seed=9)
    caches = [m.new_cache_set(SIZING).new_request() for m in (cpu, model)]
    logits = [m(tokens, c, logits="all") for m, c in zip((cpu, model), caches)]
    assert float((logits[0] - logits[1].cpu()).abs().max()) <= 1e-4
    last = [lg[-1] for lg in logits]
    for _ in range(6):
        next_tokens = [int(lg.argmax()) for lg in last]
        assert next_tokens[0] == next_tokens[1]
        last = [m(torch.tensor([next_tokens[0]]), c, logits="last") for m, c in zip((cpu, model), caches)]
        assert float((last[0] - last[1].cpu()).abs().max()) <= 1e-4
    for c in caches:
        c.release()


def test_window_step_replays_one_whole_graph(model):
    """A single request's window step on top of its transferred prefix: one whole-forward graph at
    (1 slot, 128 rows, context), equal to the eager runner's segment path and leaving the same caches."""
    sizing = CacheSizing(max_requests=4, max_tokens=1024, max_chunk_tokens=128)
    graph, eager = GraphRunner(model, SPEC), GraphRunner(model, SPEC, backend="eager", moe="static")
    for n, semantics in ((300, "asym-exact-encoder"), (301, "asym"), (90, "asym-exact-encoder")):
        tokens = prompt(model.cfg, n, seed=1800 + n)
        split = SplitPlan(model.cfg, n, 128, semantics)
        prefix = run_prefix_on_full_model(model, model.new_cache_set(sizing), tokens, split)
        on_graph = install_prefix(model, model.new_cache_set(sizing), prefix, split)
        on_eager = install_prefix(model, model.new_cache_set(sizing), prefix, split)
        window = tokens[split.boundary:]
        got = graph.run([StepRows(on_graph, window, W)])
        want = eager.run([StepRows(on_eager, window, W)])
        assert got.choice.kind is GraphKind.ROW_BUCKET
        assert max_diff(got.logits, want.logits) <= 1e-5 and same_argmax(got.logits, want.logits)
        assert_same_caches(on_graph, on_eager, tol=1e-5)
        on_graph.release()
        on_eager.release()
    stats = graph.stats()
    assert (stats.graph_forwards, stats.eager_segment_calls, stats.forwards["row_bucket"]) == (3, 0, 3)


def test_warm_up_captures_before_the_first_step(model):
    """warm_up captures decode buckets 1 and 2 (max_running 2, width 4) and the single-window shape at
    every context capacity the cache set reaches (max_tokens 512: 64 .. 512); a step then only replays."""
    sizing = CacheSizing(max_requests=3, max_tokens=512)
    t = twins(model, [40, 90], sizing=sizing)
    graph, eager = GraphRunner(model, SPEC), GraphRunner(model, SPEC, backend="eager", moe="static")
    assert graph.warm_up(t.run[0].set, max_running=2) == 3 * 4
    tokens = [prompt(model.cfg, 4, seed=1900 + i) for i in range(2)]
    got, want = graph_and_eager_step(t, graph, eager, tokens, [D, D])
    assert max_diff(got.logits, want.logits) <= 1e-5
    assert graph.stats().graph_captures == 12
    t.release()
