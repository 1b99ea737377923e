"""The whole-forward decode graph on CPU (emulated graph backend) equals the reference model and caches.

Backend 'emulated_graph' keeps static buffers and replay semantics and runs every call under
no_host_sync. FULL decode steps of requests at different positions (odd and even,
crossing ratio-2 pairs, ratio-1 rows, window pages and the window's drop, a context-capacity bucket
change), plain decode and short verifies, padded batch slots and several consecutive steps equal
the reference model (fp32, 1e-5) and leave the same caches; padding writes no stored row; a failed
reservation rolls back; prepared shapes only replay."""

from __future__ import annotations

import pytest
import torch

from model.graph_runner_helpers import (Twins, assert_same_caches, cache_state, exhausted_window_pages, max_diff,
                                        same_argmax, step_both, twins)
from model.helpers import build, prompt
from sglang_asym.asym import install_prefix, run_prefix_on_full_model, run_window
from sglang_asym.cache import CacheSizing, OutOfPages
from sglang_asym.model.capture_guard import CaptureUnsafe, no_host_sync
from sglang_asym.model.decode_graph import DecodeForward, DecodeShape, context_capacity, scatter_rows
from sglang_asym.model.decode_plan import DecodeStep, flat_slots
from sglang_asym.model.graph_runner import GraphRunner, RowKind, StepFailed, StepRows
from sglang_asym.sched import ForwardKind, GraphChoice, GraphConfig, GraphKind, SchedulerConfig
from sglang_asym.split import SplitPlan

D = RowKind.DECODE
GRAPHS = GraphConfig(decode_batch_sizes=(1, 2, 4, 8), window_row_bucket=128, max_window_graph_rows=512,
                     mixed_row_buckets=(32, 64, 128, 256))
SPEC = SchedulerConfig(num_draft_tokens=3, max_running=8, token_budget=512, graphs=GRAPHS)  # verify width 4
PLAIN = SchedulerConfig(num_draft_tokens=0, max_running=8, token_budget=512, graphs=GRAPHS)  # width 1
TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return build("tiny", seed=1)


def check_step(t, runner, q_lens, seed, expect_shape):
    tokens = [prompt(t.model.cfg, q, seed=seed + i) for i, q in enumerate(q_lens)]
    out, ref = step_both(t, runner, tokens, [D] * len(q_lens))
    assert (out.choice.kind, out.choice.padded_shape) == (GraphKind.FULL, expect_shape)
    assert max_diff(out.logits, ref) <= TOL and same_argmax(out.logits, ref)
    for got, want in zip(t.run, t.ref):
        assert_same_caches(got, want, tol=TOL)
    return out, ref


def test_verify_steps_equal_reference_and_leave_same_caches(model):
    # 125: odd start, its window crosses position 128 and page 2; 62: crosses window page 1 and
    # index-candidate blocks; 250: its window drops pages, its ratio-1 rows pass 256 during the run
    t = twins(model, [125, 62, 250])
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    steps = ([1, 4, 2], [4, 1, 3], [3, 3, 1], [2, 4, 4], [1, 1, 1], [4, 2, 1])
    for step, q_lens in enumerate(steps):
        check_step(t, runner, q_lens, 100 + 10 * step, (4, 4))  # 3 requests: one padded batch slot
    assert [c.pos for c in t.run] == [125 + 15, 62 + 15, 250 + 12]
    stats = runner.stats()
    assert stats.forwards == {"full": 6, "row_bucket": 0, "breakable": 0, "eager": 0}
    assert (stats.graph_forwards, stats.eager_forwards, stats.eager_segment_calls) == (6, 0, 0)
    # one whole-forward graph per (4, 4, context): 256 until request 2 passes 256 ratio-1 rows, then 512
    assert (stats.graph_captures, stats.graph_replays, stats.captured_shapes) == (2, 6, 2)
    assert (stats.actual_rows, stats.padded_rows) == (42, 6 * 16)
    t.release()


def test_plain_decode_and_batch_buckets(model):
    """Width 1 (no drafts): buckets 1, 2, 4 and 8 in turn, requests joining and leaving."""
    t = twins(model, [31, 64, 127, 128, 129, 7])
    everyone = (t.run, t.ref)
    runner = GraphRunner(model, PLAIN, backend="emulated_graph")
    for step, n in enumerate([1, 2, 3, 6, 5, 6, 1]):
        t.run, t.ref = everyone[0][:n], everyone[1][:n]
        bucket = next(b for b in GRAPHS.decode_batch_sizes if b >= n)
        check_step(t, runner, [1] * n, 500 + 10 * step, (bucket, 1))
    t.run, t.ref = everyone
    t.release()


def test_rollback_after_graph_step(model):
    """A verify step through the graph, then a rejected suffix rolled back (tails rebuilt from the
    journal the graph step recorded), then more steps: still equal to the reference."""
    t = twins(model, [40, 91])
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    check_step(t, runner, [4, 4], 700, (2, 4))
    for cache, keep in zip(t.run + t.ref, [41, 93, 41, 93]):  # accept 1 and 2 of 4 rows (odd and even ends)
        cache.truncate(keep)
    for got, want in zip(t.run, t.ref):
        assert_same_caches(got, want, tol=TOL)
    check_step(t, runner, [3, 4], 710, (2, 4))
    check_step(t, runner, [1, 2], 720, (2, 4))
    t.release()


def test_padding_writes_no_stored_row(model):
    """Every pool row a step changes is one of the rows its real requests reserved and stored; the
    padding slot and short verifies' padding rows (pointed at a sink slot) rewrite nothing."""
    t = twins(model, [77, 150])
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    check_step(t, runner, [1, 2], 800, (2, 4))  # capture first: the later replay is what is checked
    pools = t.run[0].set.pools
    before = {name: pool.storage.clone() for name, pool in pools.items()}
    ends = [{name: rows.end for name, rows in c.groups.items()} for c in t.run]
    check_step(t, runner, [1, 1], 810, (2, 4))
    allowed = {name: set() for name in pools}
    for c, old in zip(t.run, ends):
        for name, rows in c.groups.items():
            allowed[name].update(flat_slots([rows], torch.arange(old[name], rows.end).view(1, -1)).flatten().tolist())
    for name, pool in pools.items():
        if name.startswith("tail."):
            continue  # tails are rewritten by the host bookkeeping (set_tail), not by the graph
        rows = pool.spec.num_pages * pool.spec.page_rows
        changed = (pool.storage.reshape(rows, -1) != before[name].reshape(rows, -1)).any(-1)
        changed_slots = set(torch.arange(rows)[changed].tolist())
        assert changed_slots <= allowed[name], name
    t.release()


def test_decode_forward_is_capture_safe_and_sinks_padding(model):
    """The decode function itself under no_host_sync with an all-padding step leaves every pool as it
    was; the emulated executor's guard is live (a host sync inside a graph raises)."""
    t = twins(model, [50])
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    cache_set = t.run[0].set
    shape = DecodeShape(2, 4, context_capacity(50))
    fn = DecodeForward(runner.program, cache_set, shape)
    before = {name: pool.storage.clone() for name, pool in cache_set.pools.items()}
    inputs = DecodeStep(runner.program, [], shape).prepare(torch.device("cpu"))  # host side: may sync
    with no_host_sync():
        outputs = fn(*inputs)
    assert outputs[0].shape == (8, model.cfg.vocab_size) and bool(torch.isfinite(outputs[0]).all())
    for name, pool in cache_set.pools.items():
        assert torch.equal(pool.storage, before[name]), name
    with pytest.raises(CaptureUnsafe):  # the emulated executor runs every graph under the guard
        runner._graphs.call(("probe",), lambda x: (x * float(x.sum()),), (torch.ones(2),))
    t.release()


def test_scatter_rows_keeps_masked_slots():
    flat = torch.arange(12.0).view(6, 2)
    scatter_rows(flat, torch.tensor([4, 5, 5]), -torch.ones(3, 2), torch.tensor([True, False, False]))
    assert torch.equal(flat, torch.tensor([[0., 1], [2, 3], [4, 5], [6, 7], [-1, -1], [10, 11]]))


def test_failed_reservation_rolls_back(model):
    t, give_back = exhausted_window_pages(model)  # request 1's next row opens a new window page
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    states = [cache_state(c) for c in t.run]
    free = t.run[0].set.free_pages()
    tokens = [prompt(model.cfg, q, seed=900 + i) for i, q in enumerate([3, 2])]
    rows = [StepRows(c, tok) for c, tok in zip(t.run, tokens)]
    with pytest.raises(StepFailed) as failed:
        runner.run(rows)
    assert isinstance(failed.value.cause, OutOfPages)
    assert (failed.value.layer, failed.value.rolled_back, failed.value.unrecoverable) == (None, (0, 1), ())
    assert t.run[0].set.free_pages() == free  # every reserved page given back
    for c, state in zip(t.run, states):
        assert cache_state(c)["pos"] == state["pos"]
        assert {n: g[:2] for n, g in cache_state(c)["groups"].items()} == {n: g[:2] for n, g in state["groups"].items()}
    give_back()
    out = runner.run(rows)
    ref = [model(tok, c, logits="all") for c, tok in zip(t.ref, tokens)]
    assert max_diff(out.logits, ref) <= TOL and same_argmax(out.logits, ref)
    for got, want in zip(t.run, t.ref):
        assert_same_caches(got, want, tol=TOL)
    t.release()
    t.run[0].set.check_no_leak()


def test_prepared_decode_graph_only_replays(model):
    t = twins(model, [20, 21, 22])
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    before = {name: pool.storage.clone() for name, pool in t.run[0].set.pools.items()}
    runner.prepare(GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 1, 1, (4, 4)), 16, cache_set=t.run[0].set,
                   context=30, capture_layers=(6, 7, 8))
    for name, pool in t.run[0].set.pools.items():
        assert torch.equal(pool.storage, before[name]), name
    assert runner.stats().graph_captures == 1
    tokens = [prompt(model.cfg, 4, seed=950 + i) for i in range(3)]
    out = runner.run([StepRows(c, tok) for c, tok in zip(t.run, tokens)], capture_layers=(8, 6, 7))
    ref, features = [], []
    for c, tok in zip(t.ref, tokens):
        ref.append(model(tok, c, logits="all", capture=(6, 7, 8)))
        features.append(dict(model.captured))
    assert max_diff(out.logits, ref) <= TOL
    # drafter features: each captured layer's stream-averaged input rows, per request
    assert sorted(out.features) == [6, 7, 8]
    for layer, per_request in out.features.items():
        assert max_diff(list(per_request), [f[layer] for f in features]) <= TOL
    stats = runner.stats()
    assert (stats.graph_captures, stats.graph_replays) == (1, 2)
    t.release()


def test_eager_backend_runs_full_choice_unpadded(model):
    t = twins(model, [30, 45, 60])
    runner = GraphRunner(model, SPEC, backend="eager")
    tokens = [prompt(model.cfg, q, seed=980 + i) for i, q in enumerate([2, 1, 4])]
    out, ref = step_both(t, runner, tokens, [D] * 3)
    assert out.choice == GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 3, 7, (4, 4))
    assert max_diff(out.logits, ref) <= TOL
    stats = runner.stats()
    assert stats.forwards["full"] == 1 and (stats.actual_rows, stats.padded_rows) == (7, 7)
    assert (stats.eager_forwards, stats.graph_forwards) == (1, 0)
    t.release()


def test_small_config_steps():
    """The 40-layer role schedule of the small config (ratio-2 and ratio-1 sources, reindex and reuse
    layers, candidate blocks of 8): verify and plain steps from odd and even positions."""
    small = build("small", seed=0)
    t = twins(small, [129, 66], sizing=CacheSizing(max_requests=3, max_tokens=512))
    runner = GraphRunner(small, SPEC, backend="emulated_graph")
    for step, q_lens in enumerate(([4, 3], [1, 4], [2, 1])):
        check_step(t, runner, q_lens, 1100 + 10 * step, (2, 4))
    t.release()


def test_release_cache_quant_runs_the_whole_graph():
    """The release formats (FP8 window KV, NVFP4 compressed rows, MXFP4 index keys and queries) inside the
    whole-forward graph: its quantizer skips the host-side refusals, so FULL choices are one graph, and
    the steps agree with the reference model, whose quantizer does refuse (same bits for finite rows).
    A value within ~1e-7 of an FP4 boundary may round the other way under the graph's summation order
    (where depends on the CPU), so logits agree to 1e-3 with the same argmax, not to 1e-5."""
    quant = build("tiny", seed=1, cache_quant="release")
    t = twins(quant, [40, 57, 129])
    runner = GraphRunner(quant, SPEC, backend="emulated_graph")
    assert runner.whole_decode_graphs
    for step, q_lens in enumerate(([4, 2, 1], [1, 3, 4], [2, 2, 2])):
        tokens = [prompt(quant.cfg, q, seed=1200 + 10 * step + i) for i, q in enumerate(q_lens)]
        out, ref = step_both(t, runner, tokens, [D] * 3)
        assert (out.choice.kind, out.choice.padded_shape) == (GraphKind.FULL, (4, 4))
        assert max_diff(out.logits, ref) <= 1e-3 and same_argmax(out.logits, ref)
    assert [c.pos for c in t.run] == [c.pos for c in t.ref] == [47, 64, 136]
    stats = runner.stats()
    assert (stats.graph_captures, stats.graph_replays, stats.eager_segment_calls) == (1, 3, 0)
    t.release()


def test_non_finite_logits_fail_the_step_before_anything_is_committed():
    """Inside the graph nothing refuses a NaN, so the host checks each request's logits after the replay:
    a token whose embedding is NaN fails the step, nothing is committed (every request where it was and
    every reserved page given back), and the other requests then run alone through the graph."""
    bad_model = build("tiny", seed=1)
    poison = 17
    with torch.no_grad():
        bad_model.embed.weight[poison] = float("nan")
    t = twins(bad_model, [33, 48])
    runner = GraphRunner(bad_model, SPEC, backend="emulated_graph")
    states = [cache_state(c) for c in t.run]
    free = t.run[0].set.free_pages()
    good = prompt(bad_model.cfg, 3, seed=1250)
    good = torch.where(good == poison, good + 1, good)
    with pytest.raises(StepFailed) as failed:
        runner.run([StepRows(t.run[0], good), StepRows(t.run[1], torch.tensor([5, poison]))])
    assert "request(s) [1] of the decode step produced NaN or inf logits" in str(failed.value.cause)
    assert (failed.value.layer, failed.value.rolled_back, failed.value.unrecoverable) == (None, (0, 1), ())
    assert t.run[0].set.free_pages() == free
    for c, state in zip(t.run, states):
        now = cache_state(c)
        assert (now["pos"], now["floor"]) == (state["pos"], state["floor"])
        for name, (start, end, rows) in state["groups"].items():
            assert now["groups"][name][:2] == (start, end) and torch.equal(now["groups"][name][2], rows), name
    out = runner.run([StepRows(t.run[0], good)])
    ref = bad_model(good, t.ref[0], logits="all")
    assert max_diff(list(out.logits), [ref]) <= TOL
    t.release()


def test_unknown_capture_layers_are_ignored(model):
    t = twins(model, [33])
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    out = runner.run([StepRows(t.run[0], prompt(model.cfg, 2, seed=1300))], capture_layers=(99, 3))
    assert sorted(out.features) == [3] and out.features[3][0].shape == (2, model.cfg.hidden_size)
    t.release()


@pytest.mark.parametrize("semantics", ["asym", "asym-exact-encoder"])
def test_decode_after_split_window_step(model, semantics):
    """Requests installed from a transferred prefix (window rows from the boundary on, window floors
    at it) and past their window step: decode steps through the graph read only keys above the floor."""
    sizing = CacheSizing(max_requests=4, max_tokens=512, max_chunk_tokens=128)
    run_set, ref_set = model.new_cache_set(sizing), model.new_cache_set(sizing)
    run, ref = [], []
    for i, n in enumerate([300, 201, 150]):
        tokens = prompt(model.cfg, n, seed=1400 + i)
        split = SplitPlan(model.cfg, n, 128, semantics)
        prefix = run_prefix_on_full_model(model, model.new_cache_set(sizing), tokens, split)
        for cache_set, caches in ((run_set, run), (ref_set, ref)):
            caches.append(run_window(model, cache_set, prefix, tokens, split, logits="none")[1])
    assert any(c.swa_floor for c in run)
    t = Twins(model, ref, run)
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    for step, q_lens in enumerate(([4, 1, 2], [3, 4, 4], [1, 2, 3])):
        check_step(t, runner, q_lens, 1400 + 10 * step, (4, 4))
    t.release()


WINDOW_CASES = [(300, "asym-exact-encoder"), (301, "asym"), (301, "decoder-replay"), (100, "asym-exact-encoder")]


@pytest.mark.parametrize("quant", ["none", "release"])
def test_window_step_runs_as_one_whole_graph(quant):
    """A window-only step of one request (its final prompt rows on top of the transferred prefix, or the
    whole prompt for N <= W) is one whole-forward graph at (1 slot, 128 rows, context); in chunks too
    (40 rows, then the rest). Unquantized, its logits, the caches it leaves and the decode steps after
    it equal the reference model run over the same chunks (1e-5). With the release formats a value
    within ~1e-7 of an FP4 boundary may round the other way under the graph's summation order (the
    reference model's own chunked and whole windows differ the same way), so there the logits agree
    to 1e-3 with the same argmax."""
    model = build("tiny", seed=1, cache_quant=quant)
    sizing = CacheSizing(max_requests=4, max_tokens=1024, max_chunk_tokens=128)
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    for n, semantics in WINDOW_CASES:
        tokens = prompt(model.cfg, n, seed=1500 + n)
        split = SplitPlan(model.cfg, n, 128, semantics)
        prefix = run_prefix_on_full_model(model, model.new_cache_set(sizing), tokens, split)
        ref_set, run_set = model.new_cache_set(sizing), model.new_cache_set(sizing)
        ref, run = install_prefix(model, ref_set, prefix, split), install_prefix(model, run_set, prefix, split)
        window = tokens[split.boundary:]
        chunks = [window] if n % 2 else [window[:40], window[40:]]
        for i, chunk in enumerate(chunks):
            logits = "last" if i == len(chunks) - 1 else "none"
            out = runner.run([StepRows(run, chunk, RowKind.WINDOW, logits)])
            want = model(chunk, ref, logits=logits)
            assert (out.choice.kind, out.choice.padded_shape) == (GraphKind.ROW_BUCKET, (128,))
        assert same_argmax([out.logits[0]], [want])
        assert run.pos == ref.pos == n
        if quant == "release":
            assert max_diff([out.logits[0]], [want]) <= 1e-3
            ref.release()
            run.release()
            continue
        assert max_diff([out.logits[0]], [want]) <= TOL
        assert_same_caches(run, ref, tol=TOL)
        t = Twins(model, [ref], [run])
        for step, q_len in enumerate([4, 1, 3]):
            check_step(t, runner, [q_len], 1600 + n + 10 * step, (1, 4))
        t.release()
        run_set.check_no_leak()
    stats = runner.stats()
    assert stats.eager_segment_calls == 0 and stats.eager_forwards == 0
    assert stats.forwards["row_bucket"] == 6
    assert stats.forwards["full"] == (0 if quant == "release" else 3 * len(WINDOW_CASES))


def test_windows_sharing_a_row_bucket_keep_the_segment_path(model):
    """Two windows of 50 and 40 rows pad to one 128-row bucket: no slot per request, so the step replays
    the segment graphs with eager attention between them (still equal to the reference)."""
    t = twins(model, [20, 30])
    runner = GraphRunner(model, SPEC, backend="emulated_graph")
    tokens = [prompt(model.cfg, 50, seed=1700), prompt(model.cfg, 40, seed=1701)]
    out, ref = step_both(t, runner, tokens, [RowKind.WINDOW] * 2)
    assert (out.choice.kind, out.choice.padded_shape) == (GraphKind.ROW_BUCKET, (128,))
    assert max_diff(out.logits, ref) <= TOL
    stats = runner.stats()
    assert stats.graph_forwards == 1 and stats.eager_segment_calls == 0 and stats.graph_captures > 1  # segments
    t.release()
