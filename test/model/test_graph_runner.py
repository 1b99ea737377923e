"""The graph runner on CPU: every shape decision (full decode bucket, 128-row window bucket, breakable
mixed, eager fallback) equals the reference model's forward (fp32, 1e-5, same greedy tokens), run as
unpadded segments with eager attention (backend 'eager'), as padded emulated segment graphs, or (full
decode buckets) as emulated whole-forward graphs (see test_decode_graph); padding rows never reach
real rows; the segments are capture-safe; bad input and a failed step are handled."""

from __future__ import annotations

import pytest
import torch

from model.graph_runner_helpers import exhausted_window_pages, max_diff, same_argmax, step_both, twins
from model.helpers import build, prompt
from sglang_asym.cache import OutOfPages
from sglang_asym.model import InvalidInput, greedy_continue
from sglang_asym.model.capture_guard import CaptureUnsafe, no_host_sync
from sglang_asym.model.graph_runner import GraphRunner, RowKind, RowLayout, StepFailed, StepRows
from sglang_asym.model.segments import SegmentProgram
from sglang_asym.model.static_moe import MoEPath, moe_path_for_rows, static_moe, stack_experts
from sglang_asym.sched import ForwardKind, GraphChoice, GraphConfig, GraphKind, MixedBackend, SchedulerConfig

D, W = RowKind.DECODE, RowKind.WINDOW
GRAPHS = GraphConfig(decode_batch_sizes=(1, 2, 4, 8), window_row_bucket=128, max_window_graph_rows=512,
                     mixed_row_buckets=(32, 64, 128, 256))
SPEC = SchedulerConfig(num_draft_tokens=3, max_running=8, token_budget=512, graphs=GRAPHS)  # verify width 4
TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return build("tiny", seed=1)


def segment_calls(model, forwards: int, with_head: int) -> int:
    return forwards * (model.cfg.num_hidden_layers + 1) + with_head


def test_full_decode_bucket_matches_reference(model):
    t = twins(model, [60, 33, 90, 41])
    runner = GraphRunner(model, SPEC, moe="static")
    for step, q_lens in enumerate(([4, 2, 1], [1, 1, 1], [3, 4, 4])):
        tokens = [prompt(model.cfg, q, seed=100 + 10 * step + i) for i, q in enumerate(q_lens)]
        out, ref = step_both(t, runner, tokens, [D] * 3)
        assert out.choice == GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 3, sum(q_lens), (4, 4))
        assert max_diff(out.logits, ref) <= TOL and same_argmax(out.logits, ref)
    # all four requests: the batch bucket is exactly 4, no empty slots, verify width 4 each
    tokens = [prompt(model.cfg, 4, seed=200 + i) for i in range(4)]
    out, ref = step_both(t, runner, tokens, [D] * 4)
    assert out.choice.padded_shape == (4, 4) and out.choice.padding_rows == 0
    assert max_diff(out.logits, ref) <= TOL and same_argmax(out.logits, ref)
    assert [c.pos for c in t.run] == [c.pos for c in t.ref]
    stats = runner.stats()
    assert stats.forwards == {"full": 4, "row_bucket": 0, "breakable": 0, "eager": 0}
    assert (stats.eager_forwards, stats.graph_forwards, stats.eager_fallbacks) == (4, 0, 0)
    # backend 'eager' runs the chosen (4, 4) shape unpadded: padding only serves graph replay
    assert (stats.actual_rows, stats.padded_rows) == (7 + 3 + 11 + 16, 7 + 3 + 11 + 16)
    assert stats.eager_segment_calls == segment_calls(model, 4, 4)
    assert (stats.graph_captures, stats.graph_replays, stats.captured_shapes) == (0, 0, 0)
    t.release()


def test_window_row_bucket_then_decode(model):
    t = twins(model, [70, 20, 130])
    runner = GraphRunner(model, SPEC, moe="static")
    tokens = [prompt(model.cfg, n, seed=300 + i) for i, n in enumerate([50, 40, 60])]
    out, ref = step_both(t, runner, tokens, [W] * 3, logits=["last", "none", "all"])
    assert out.choice == GraphChoice(ForwardKind.WINDOW, GraphKind.ROW_BUCKET, 3, 150, (256,))
    assert out.logits[1] is None and out.logits[0].shape == (model.cfg.vocab_size,)
    assert out.logits[2].shape == (60, model.cfg.vocab_size)
    assert max_diff(out.logits, ref) <= TOL and same_argmax(out.logits, ref)
    # a full 128-row window fills its bucket exactly
    out, ref = step_both(t, runner, [prompt(model.cfg, 128, seed=310)], [W])
    assert out.choice.padded_shape == (128,) and out.choice.padding_rows == 0
    assert max_diff(out.logits, ref) <= TOL
    out, ref = step_both(t, runner, [prompt(model.cfg, 1, seed=320 + i) for i in range(3)], [D] * 3)
    assert out.choice.kind is GraphKind.FULL
    assert max_diff(out.logits, ref) <= TOL and same_argmax(out.logits, ref)
    t.release()


@pytest.mark.parametrize("backend, kind, padded", [(MixedBackend.BREAKABLE, GraphKind.BREAKABLE, (64,)),
                                                   (MixedBackend.EAGER, GraphKind.EAGER, (37,))])
def test_mixed_step(model, backend, kind, padded):
    graphs = GraphConfig(decode_batch_sizes=(1, 2, 4, 8), mixed_backend=backend, mixed_row_buckets=(32, 64, 128))
    runner = GraphRunner(model, SchedulerConfig(num_draft_tokens=3, max_running=8, token_budget=512, graphs=graphs),
                         backend="emulated_graph")  # a graph backend pads the breakable shape
    t = twins(model, [64, 90, 10])
    tokens = [prompt(model.cfg, n, seed=400 + i) for i, n in enumerate([4, 1, 32])]
    out, ref = step_both(t, runner, tokens, [D, D, W])
    assert (out.choice.forward, out.choice.kind, out.choice.padded_shape) == (ForwardKind.MIXED, kind, padded)
    assert max_diff(out.logits, ref) <= TOL and same_argmax(out.logits, ref)
    stats = runner.stats()
    assert stats.eager_fallbacks == (1 if kind is GraphKind.EAGER else 0)
    assert stats.padded_rows == padded[0]
    t.release()


def test_eager_fallback_when_no_bucket_fits(model):
    runner = GraphRunner(model, SchedulerConfig(num_draft_tokens=0, max_running=4, token_budget=256,
                                                graphs=GraphConfig(decode_batch_sizes=(1, 2))), moe="static")
    t = twins(model, [20, 21, 22])
    out, ref = step_both(t, runner, [prompt(model.cfg, 1, seed=500 + i) for i in range(3)], [D] * 3)
    assert (out.choice.kind, out.choice.padded_shape) == (GraphKind.EAGER, (3,))
    assert max_diff(out.logits, ref) <= TOL
    stats = runner.stats()
    assert (stats.eager_fallbacks, stats.actual_rows, stats.padded_rows) == (1, 3, 3)
    t.release()


@pytest.mark.parametrize("backend, moe", [("eager", "static"), ("emulated_graph", "static"), ("eager", "routed")])
def test_greedy_generation_equals_reference(model, backend, moe):
    """Plain decode (width 1) of four requests through the runner gives the reference's greedy tokens."""
    runner = GraphRunner(model, SchedulerConfig(num_draft_tokens=0, max_running=4, token_budget=256, graphs=GRAPHS),
                         backend=backend, moe=moe)
    lens, steps = [30, 65, 128, 7], 8
    t = twins(model, [n - 1 for n in lens])
    last = [prompt(model.cfg, n, seed=i)[-1:] for i, n in enumerate(lens)]
    expected = []
    for cache, tok in zip(t.ref, last):
        expected.append(greedy_continue(model, cache, model(tok, cache, logits="last"), steps)[0])
    logits = [runner.run([StepRows(c, tok, W) for c, tok in zip(t.run, last)]).logits]
    got = [[int(lg.argmax())] for lg in logits[0]]
    for _ in range(steps - 1):
        rows = [StepRows(c, torch.tensor([g[-1]])) for c, g in zip(t.run, got)]
        for g, lg in zip(got, runner.run(rows).logits):
            g.append(int(lg[-1].argmax()))
    assert got == expected
    assert runner.stats().forwards["full"] == steps - 1
    t.release()


def test_emulated_graph_path_equals_reference(model):
    """The graph path's buffer handling (static inputs, chained outputs, outputs overwritten by every
    replay) on CPU: decode buckets (whole-forward graphs), a window bucket and a mixed step (segment
    graphs) equal the reference; each graph is captured once and replayed on every later step."""
    t = twins(model, [60, 33, 90])
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    segments = model.cfg.num_hidden_layers + 1
    steps = [([4, 2, 1], [D, D, D]), ([4, 4, 4], [D, D, D]), ([1, 3], [D, D]), ([2, 1, 20], [D, D, W]),
             ([40, 30, 50], [W, W, W]), ([3, 2, 1], [D, D, D])]  # the last replays the first step's graphs
    everyone = (t.run, t.ref)
    for step, (q_lens, kinds) in enumerate(steps):
        tokens = [prompt(model.cfg, q, seed=900 + 10 * step + i) for i, q in enumerate(q_lens)]
        t.run, t.ref = everyone[0][: len(q_lens)], everyone[1][: len(q_lens)]
        out, ref = step_both(t, runner, tokens, kinds)
        assert max_diff(out.logits, ref) <= TOL and same_argmax(out.logits, ref)
        if step == 0:
            kept, kept_ref = out, ref
    assert max_diff(kept.logits, kept_ref) <= TOL  # returned logits are not graph buffers overwritten later
    t.run, t.ref = everyone
    stats = runner.stats()
    assert stats.forwards == {"full": 4, "row_bucket": 1, "breakable": 1, "eager": 0}
    assert (stats.graph_forwards, stats.eager_forwards, stats.eager_segment_calls) == (6, 0, 0)
    # whole-forward decode graphs (batch, width, context): (4, 4, 128), (2, 4, 128), and (4, 4, 256) once
    # request 2 passes 128 compressed rows (step 5: 90 + 1 + 4 + 20 + 50 + 1 = 166 tokens);
    # segment graphs at 32 rows (mixed) and 128 (window), each with a head graph at 4 logit rows
    assert stats.graph_captures == stats.captured_shapes == 3 + 2 * segments + 2
    assert stats.graph_replays == 4 + 2 * (segments + 1)
    t.release()


def test_layout_places_requests_in_slots():
    full = GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 3, 7, (4, 4))
    layout = RowLayout.for_choice(full, [4, 2, 1])
    assert (layout.rows, layout.starts) == (16, (0, 4, 8))
    assert torch.equal(layout.real_rows(torch.device("cpu")), torch.tensor([0, 1, 2, 3, 4, 5, 8]))
    packed = RowLayout.for_choice(GraphChoice(ForwardKind.WINDOW, GraphKind.ROW_BUCKET, 2, 150, (256,)), [100, 50])
    assert (packed.rows, packed.starts, packed.real_rows(torch.device("cpu"))) == (256, (0, 100), slice(0, 150))
    with pytest.raises(ValueError, match="do not fit"):
        RowLayout.for_choice(full, [5, 1, 1])


def _random_carry(model, rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    s, d = model.cfg.hc_mult, model.cfg.hidden_size
    comb = torch.rand(rows, s, s, generator=g)
    return (torch.randn(rows, s, d, generator=g), torch.rand(rows, s, generator=g) + 0.1,
            2 * torch.rand(rows, s, generator=g), comb / comb.sum(-1, keepdim=True),
            torch.randn(rows, d, generator=g))


@pytest.mark.parametrize("rows", [4, 16])  # gather MoE path at 4 rows, dense at 16 (tiny: 8 experts, top-2)
def test_padding_rows_never_reach_real_rows(model, rows):
    """Every segment is row-wise: garbage in the padding rows (any token, any routing) leaves the real
    rows' outputs bit-identical."""
    program = SegmentProgram(model)
    real = 3
    assert program.moe_path(rows) is (MoEPath.GATHER if rows == 4 else MoEPath.DENSE)
    clean_tokens = torch.zeros(rows, dtype=torch.long)
    clean_tokens[:real] = torch.tensor([5, 77, 300])
    dirty_tokens = clean_tokens.clone()
    dirty_tokens[real:] = torch.randint(0, model.cfg.vocab_size, (rows - real,), generator=torch.Generator().manual_seed(1))
    outs = [program.first(tok) for tok in (clean_tokens, dirty_tokens)]
    for a, b in zip(*outs):
        assert torch.equal(a[:real], b[:real])
    clean = _random_carry(model, rows, seed=2)
    dirty = tuple(torch.cat((c[:real], n[real:])) for c, n in zip(clean, _random_carry(model, rows, seed=3)))
    for i in range(program.num_layers - 1):
        for a, b in zip(program.between(i)(*clean), program.between(i)(*dirty)):
            assert torch.equal(a[:real], b[:real]), f"segment between layers {i} and {i + 1}"
    (a,), (b,) = program.last(*clean), program.last(*dirty)
    assert torch.equal(a[:real], b[:real])


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 64])
def test_static_moe_matches_reference_moe(model, rows):
    moe = model.layers[2].ffn
    experts = stack_experts(moe)
    x = torch.randn(rows, model.cfg.hidden_size, generator=torch.Generator().manual_seed(rows))
    want = moe(x)
    for path in MoEPath:
        got = static_moe(moe, experts, x, path)
        assert float((got - want).abs().max()) <= 1e-6, path
    assert moe_path_for_rows(rows, 8, 2) is (MoEPath.GATHER if rows <= 4 else MoEPath.DENSE)


def test_stacked_experts_are_views_and_shared(model):
    moe = model.layers[0].ffn
    first = stack_experts(moe)
    assert stack_experts(moe) is first  # a second runner shares the stack
    assert moe.experts[3].w2.weight.data_ptr() == first.w2[3].data_ptr()
    runner = GraphRunner(model, SPEC, moe="static")
    runner.program.check_weights()


@pytest.mark.parametrize("rows", [1, 16, 128])
def test_segments_are_capture_safe(model, rows):
    """No host sync and no data-dependent shape in any segment (what a CUDA graph needs); output
    shapes depend on the row count only."""
    program = SegmentProgram(model)
    tokens = torch.randint(0, model.cfg.vocab_size, (rows,), generator=torch.Generator().manual_seed(rows))
    with no_host_sync():
        carry = program.first(tokens)
        for i in range(program.num_layers - 1):
            carry = program.between(i)(*carry[:4], torch.randn(rows, model.cfg.hidden_size))
        (hidden,) = program.last(*carry[:4], torch.randn(rows, model.cfg.hidden_size))
        (logits,) = program.head(hidden, torch.arange(rows))
    s, d = model.cfg.hc_mult, model.cfg.hidden_size
    assert [tuple(t.shape) for t in carry] == [(rows, s, d), (rows, s), (rows, s), (rows, s, s), (rows, d)]
    assert logits.shape == (rows, model.cfg.vocab_size) and bool(torch.isfinite(logits).all())


def test_capture_guard_catches_unsafe_ops(model):
    x = torch.randn(6, model.cfg.hidden_size)
    with pytest.raises(CaptureUnsafe):
        with no_host_sync():
            model.layers[0].ffn(x)  # the reference MoE loops over torch.unique(...) on the host
    for unsafe in (lambda: x[0, 0].item(), lambda: x[x > 0], lambda: x.tolist(), lambda: bool(x[0, 0] > 0),
                   lambda: torch.nonzero(x)):
        with pytest.raises(CaptureUnsafe):
            with no_host_sync():
                unsafe()
    assert isinstance(x.tolist(), list)  # restored after the block


def test_routed_moe_runner_matches_too(model):
    """moe='routed' (the reference MoE, eager only: cheaper on CPU) gives the same results; it is what
    'auto' picks for the eager backend, and the graph backends get the static MoE."""
    assert GraphRunner(model, SPEC).program.moe == "routed"
    assert GraphRunner(model, SPEC, backend="emulated_graph").program.moe == "static"
    t = twins(model, [40, 50])
    runner = GraphRunner(model, SPEC, moe="routed")
    out, ref = step_both(t, runner, [prompt(model.cfg, 4, seed=600 + i) for i in range(2)], [D, D])
    assert max_diff(out.logits, ref) <= TOL
    t.release()


def test_captured_features_match_model(model):
    t = twins(model, [40, 52])
    runner = GraphRunner(model, SPEC, moe="static")
    layers = (6, 7, 8)
    tokens = [prompt(model.cfg, q, seed=700 + i) for i, q in enumerate([4, 2])]
    out = runner.run([StepRows(c, tok) for c, tok in zip(t.run, tokens)], capture_layers=layers)
    for j, (cache, tok) in enumerate(zip(t.ref, tokens)):
        model(tok, cache, logits="all", capture=layers)
        for layer in layers:
            assert float((out.features[layer][j] - model.captured[layer]).abs().max()) <= TOL
    t.release()


def test_prepare_captures_nothing_on_cpu_and_touches_no_cache(model):
    runner = GraphRunner(model, SPEC, moe="static")
    runner.prepare(GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 1, 1, (2, 4)), logit_rows=8)
    stats = runner.stats()
    assert (stats.eager_segment_calls, stats.graph_captures, sum(stats.forwards.values())) == (
        segment_calls(model, 1, 1), 0, 0)
    assert set(stats.as_dict()) >= {"forwards", "graph_replays", "graph_captures", "eager_fallbacks"}


def test_bad_input_is_rejected_before_any_cache_changes(model):
    t = twins(model, [20, 20])
    runner = GraphRunner(model, SPEC, moe="static")
    tok = prompt(model.cfg, 1)
    positions = [c.pos for c in t.run]
    with pytest.raises(ValueError, match="at least one"):
        runner.run([])
    with pytest.raises(ValueError, match="appears twice"):
        runner.run([StepRows(t.run[0], tok), StepRows(t.run[0], tok)])
    with pytest.raises(ValueError, match=r"verify width 4"):
        runner.run([StepRows(t.run[0], prompt(model.cfg, 5))])
    with pytest.raises(InvalidInput, match="empty"):
        runner.run([StepRows(t.run[0], tok), StepRows(t.run[1], torch.tensor([], dtype=torch.long))])
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        runner.run([StepRows(t.run[0], tok), StepRows(t.run[1], torch.tensor([model.cfg.vocab_size]))])
    with pytest.raises(ValueError, match="logits must be"):
        StepRows(t.run[0], tok, logits="first")
    with pytest.raises(ValueError, match="row kind"):
        StepRows(t.run[0], tok, kind="prefill")
    wrong = GraphChoice(ForwardKind.WINDOW, GraphKind.ROW_BUCKET, 1, 1, (128,))
    with pytest.raises(ValueError, match="the rows make a decode one"):
        runner.run([StepRows(t.run[0], tok)], choice=wrong)
    assert [c.pos for c in t.run] == positions
    t.run[1].release()
    with pytest.raises(RuntimeError, match="released"):
        runner.run([StepRows(t.run[0], tok), StepRows(t.run[1], tok)])
    with pytest.raises(ValueError, match="backend"):
        GraphRunner(model, SPEC, backend="tensorrt")
    with pytest.raises(ValueError, match="moe must be"):
        GraphRunner(model, SPEC, moe="sparse")
    with pytest.raises(ValueError, match="moe='static'"):
        GraphRunner(model, SPEC, backend="cuda_graph", moe="routed")
    with pytest.raises((RuntimeError, ValueError), match="CUDA"):  # a CPU model (and, here, no GPU)
        GraphRunner(model, SPEC, backend="cuda_graph")
    with pytest.raises(ValueError, match="full-role"):
        GraphRunner(build("tiny", seed=1, role="prefill"), SPEC)
    t.ref[0].release()
    t.ref[1].release()
    t.run[0].release()


def test_failed_step_rolls_every_request_back(model):
    """A request that runs out of cache pages mid-step fails the step; both requests are rolled back
    to where they started, and the same step then runs correctly once pages are free."""
    t, give_back = exhausted_window_pages(model)  # request 1's next row opens a new window page
    runner = GraphRunner(model, SPEC, moe="static")
    tokens = [prompt(model.cfg, q, seed=800 + i) for i, q in enumerate([3, 2])]
    rows = [StepRows(c, tok) for c, tok in zip(t.run, tokens)]
    with pytest.raises(StepFailed) as failed:
        runner.run(rows)
    assert isinstance(failed.value.cause, OutOfPages)
    assert (failed.value.layer, failed.value.rolled_back, failed.value.unrecoverable) == (3, (0, 1), ())
    assert [c.pos for c in t.run] == [70, 64]
    give_back()
    out = runner.run(rows)
    ref = [model(tok, c, logits="all") for c, tok in zip(t.ref, tokens)]
    assert max_diff(out.logits, ref) <= TOL and same_argmax(out.logits, ref)
    t.release()
    t.run[0].set.check_no_leak()
