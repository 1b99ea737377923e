"""The decode loop runs every forward through the model runner at the graph shape `sched.graphs` picks
for the planned step (once, in the scheduler's step): a window-only step under ROW_BUCKET, a mixed step under BREAKABLE (or, in
separate mode, a FULL decode forward then a ROW_BUCKET window forward), decode-only steps under FULL
at the batch bucket; step records and the runner's counters say so exactly, and the tokens equal the
reference model's."""

from __future__ import annotations

import threading

import pytest

from model.helpers import build, prompt
from runtime_engine.loop_helpers import run_until_done
from sglang_asym.asym import run_prefix_on_full_model
from sglang_asym.cache import CacheSizing
from sglang_asym.model.steps import greedy_continue
from sglang_asym.runtime.engine.decode_loop import ActiveRequest, DecodeLoop
from sglang_asym.runtime.engine.options import EngineOptions
from sglang_asym.runtime.engine_api import SamplingParams
from sglang_asym.sched import SchedulerConfig, choose_graphs
from sglang_asym.sched import scheduler as scheduler_module
from sglang_asym.split import SplitPlan

SIZING = CacheSizing(max_requests=5, max_tokens=512, max_chunk_tokens=128)
NEW_TOKENS = 6
# Windows of 20 and 30 rows fit the 64-row budget together; the 40-row one waits a step and runs beside
# their decode rows. Prompts under the 128-row window are whole windows (boundary 0).
LENGTHS = (20, 30, 40)


@pytest.fixture(scope="module")
def models():
    return {quant: build("tiny", seed=7, cache_quant=quant) for quant in ("release", "none")}


@pytest.fixture(scope="module")
def model(models):
    return models["release"]


def _reference(model):
    out = {}
    for n in LENGTHS:
        cache = model.new_cache_set(SIZING).new_request()
        p = prompt(model.cfg, n, seed=n)
        out[f"q{n}"], _ = greedy_continue(model, cache, model(p, cache), NEW_TOKENS)
        cache.release()
    return out


def _serve(model, mode: str, backend: str):
    sched = SchedulerConfig(token_budget=64, max_window_rows_per_step=128, max_running=4, num_draft_tokens=0,
                            window=128, mode=mode)
    cache_set = model.new_cache_set(SIZING)
    tokens, errors, steps, lock, done = {}, {}, [], threading.Lock(), threading.Event()

    def emitter(rid):
        def emit(event):
            with lock:
                tokens.setdefault(rid, []).extend(event.new_token_ids)
                if event.finished:
                    errors[rid] = event.error
                    if len(errors) == len(LENGTHS):
                        done.set()
        return emit

    loop = DecodeLoop(model, cache_set, sched, eos_token_id=-1, on_step=steps.append, graph_backend=backend)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    for n in LENGTHS:  # all queued before the loop starts: its first step sees all three
        p = prompt(model.cfg, n, seed=n)
        split = SplitPlan(model.cfg, n, 128, "asym-exact-encoder")
        prefix = run_prefix_on_full_model(model, model.new_cache_set(SIZING), p, split)
        loop.submit(ActiveRequest(f"q{n}", p, split, prefix, params, emitter(f"q{n}")))
    run_until_done(loop, done, cache_set)
    return tokens, errors, steps, loop.graph_stats


# Per step: (decode rows, window rows, graph kind of each forward). q20 and q30 get their first token
# from step 1 and their last from step 6; q40 from step 2 to step 7, alone.
MIXED = [(0, 50, ("row_bucket",)), (2, 40, ("breakable",))] + [(3, 0, ("full",))] * 4 + [(1, 0, ("full",))]
SEPARATE = [(0, 50, ("row_bucket",)), (2, 40, ("full", "row_bucket"))] + MIXED[2:]
# Rows each forward ran at: 128-row window bucket; mixed bucket 48 for 42 rows; FULL (4, 1) for three
# running requests, (2, 1) for two, (1, 1) for one.
PADDED = {"mixed": 128 + 48 + 4 * 4 + 1, "separate": 128 + 2 + 128 + 4 * 4 + 1}


# The served release cache formats and unquantized caches, eagerly and through the emulated graph path
# (static buffers, replays, the whole-forward decode graph).
@pytest.mark.parametrize("backend,quant", [("eager", "release"), ("emulated_graph", "release"),
                                           ("emulated_graph", "none")])
@pytest.mark.parametrize("mode", ["mixed", "separate"])
def test_served_steps_count_forwards_by_graph_shape(models, mode, backend, quant, monkeypatch):
    model = models[quant]
    chosen = []  # the scheduler chooses each step's graphs once; the loop runs them as chosen

    def counted(plan, config):
        chosen.append(plan.step)
        return choose_graphs(plan, config)

    monkeypatch.setattr(scheduler_module, "choose_graphs", counted)
    tokens, errors, steps, stats = _serve(model, mode, backend)
    assert chosen == [s.step for s in steps]
    assert tokens == _reference(model)
    assert all(e is None for e in errors.values())
    assert [(s.decode_rows, s.window_rows, s.graphs) for s in steps] == (MIXED if mode == "mixed" else SEPARATE)
    if mode == "mixed":
        assert stats.forwards == {"full": 5, "row_bucket": 1, "breakable": 1, "eager": 0}
    else:
        assert stats.forwards == {"full": 6, "row_bucket": 2, "breakable": 0, "eager": 0}
    assert stats.eager_fallbacks == 0
    assert stats.actual_rows == 50 + 42 + 4 * 3 + 1
    if backend == "emulated_graph":  # every forward replays its graph at the padded shape
        assert (stats.graph_forwards, stats.eager_forwards) == (7 if mode == "mixed" else 8, 0)
        assert stats.padded_rows == PADDED[mode]
    else:
        assert (stats.graph_forwards, stats.eager_forwards) == (0, 7 if mode == "mixed" else 8)


def test_graph_backend_option_is_checked(model):
    assert EngineOptions(model_path="m").graph_backend == "auto"
    idle = DecodeLoop(model, model.new_cache_set(SIZING), SchedulerConfig(num_draft_tokens=0), eos_token_id=-1)
    assert idle.runner.backend.value == "eager"  # auto on a CPU model
    assert idle.graph_stats.forwards == {"full": 0, "row_bucket": 0, "breakable": 0, "eager": 0}
    with pytest.raises(ValueError, match="--graph-backend must be one of"):
        EngineOptions(model_path="m", graph_backend="graphs")
    with pytest.raises(ValueError, match="backend must be 'auto' or one of"):
        DecodeLoop(model, model.new_cache_set(SIZING), SchedulerConfig(num_draft_tokens=0), eos_token_id=-1,
                   graph_backend="graphs")



def test_warm_up_captures_the_served_shapes_before_any_request(models):
    """With warm-up, start() captures each decode bucket up to max_running's (here 1 and 2, width 1) and
    the single-window shape, at every context capacity a request of the cache set can reach (max_tokens
    512 -> 64, 128, 256, 512): 12 graphs. Serving one request (a window step, then decode steps) then
    only replays them, and its tokens equal the reference."""
    model = models["none"]
    sched = SchedulerConfig(token_budget=64, max_window_rows_per_step=128, max_running=2, num_draft_tokens=0,
                            window=128)
    cache_set = model.new_cache_set(SIZING)
    events, done = [], threading.Event()

    def emit(event):
        events.append(event)
        if event.finished:
            done.set()

    loop = DecodeLoop(model, cache_set, sched, eos_token_id=-1, graph_backend="emulated_graph", warm_up_graphs=True)
    assert loop.warm_up_graphs and not DecodeLoop(model, cache_set, sched, eos_token_id=-1,
                                                  graph_backend="emulated_graph").warm_up_graphs
    n = 30
    p = prompt(model.cfg, n, seed=n)
    split = SplitPlan(model.cfg, n, 128, "asym-exact-encoder")
    prefix = run_prefix_on_full_model(model, model.new_cache_set(SIZING), p, split)
    loop.submit(ActiveRequest("w", p, split, prefix,
                              SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True), emit))
    run_until_done(loop, done, cache_set)
    stats = loop.graph_stats
    assert stats.graph_captures == stats.captured_shapes == 12
    assert stats.forwards["row_bucket"] == 1 and stats.forwards["full"] == NEW_TOKENS - 1
    assert stats.graph_replays == 12 + NEW_TOKENS  # the first replay of each capture, then one per step
    assert [t for e in events for t in e.new_token_ids] == _reference(model)["q30"]
    assert events[-1].error is None
