"""Speculative decoding in the decode worker's loop (DecodeLoop with a drafter, num_draft_tokens k > 0):
greedy tokens equal plain decoding for concurrent requests of several prompt lengths (window steps,
chunked windows, a request joined already running), seeded sampling is reproducible and stays in the
target's support, acceptance counters add up, and bad settings are refused."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.asym import install_prefix, run_prefix_on_full_model
from sglang_asym.cache import CacheSizing
from sglang_asym.model.dspark import Chooser, Draft, DSparkDrafter, random_drafter_weights
from sglang_asym.model.steps import greedy_continue
from sglang_asym.runtime.engine.decode_loop import ActiveRequest, DecodeLoop, StepRecord
from sglang_asym.runtime.engine_api import FinishKind, SamplingParams
from sglang_asym.sched import SchedulerConfig
from sglang_asym.split import SplitPlan

W = 128
LENGTHS = (1, 2, 60, 129, 300)  # window steps of 1 .. 128 rows, over no prefix and over a prefix
NEW_TOKENS = 10
SIZING = CacheSizing(max_requests=8, max_tokens=512, max_chunk_tokens=W)


@pytest.fixture(scope="module")
def model():
    return build("tiny", seed=3)


@pytest.fixture(scope="module")
def dspark(model):
    drafter = DSparkDrafter(model)
    drafter.load_weights(random_drafter_weights(model.cfg, 11))
    return drafter


@pytest.fixture(scope="module")
def prompts(model):
    return {f"r{n}": prompt(model.cfg, n, seed=100 + n) for n in LENGTHS}


@pytest.fixture(scope="module")
def reference(model, prompts):
    """Plain greedy decoding of each prompt on its own (run_reference-equivalent for exact-encoder)."""
    out = {}
    for rid, tokens in prompts.items():
        cache_set = model.new_cache_set(SIZING)
        split = SplitPlan(model.cfg, tokens.numel(), W, "asym-exact-encoder")
        prefix = run_prefix_on_full_model(model, model.new_cache_set(SIZING), tokens, split)
        cache = install_prefix(model, cache_set, prefix, split)
        out[rid], _ = greedy_continue(model, cache, model(tokens[split.boundary :], cache), NEW_TOKENS)
        cache.release()
    return out


class ReferenceDrafter:
    """A drafter that knows each request's plain greedy continuation (by position: the test's prompts are
    far enough apart) and proposes it, corrupting draft index corrupt_at[step % len] (k: none), so every
    accepted length 0 .. k occurs and every rollback length is exercised inside the loop."""

    feature_layers: tuple[int, ...] = ()
    max_draft = 5

    def __init__(self, prompts, reference, vocab: int, corrupt_at: tuple[int, ...]) -> None:
        self.by_pos = {}
        for rid, tokens in prompts.items():
            for i, token in enumerate(reference[rid]):
                self.by_pos[tokens.numel() + i] = token  # the token the target emits at position N + i
        self.vocab, self.corrupt_at, self.steps = vocab, corrupt_at, 0

    def new_state(self):
        return None

    def observe(self, state, captured, first_pos: int) -> None:
        pass

    def rollback(self, state, pos: int) -> None:
        pass

    def propose(self, state, anchor: int, pos: int, k: int, choose: Chooser) -> Draft:
        bad = self.corrupt_at[self.steps % len(self.corrupt_at)]
        self.steps += 1
        tokens = []
        for j in range(k):
            token = self.by_pos.get(pos + 1 + j, 0)
            tokens.append((token + 1) % self.vocab if j == bad else token)
        logits = torch.full((k, self.vocab), -30.0)
        logits[torch.arange(k), torch.tensor(tokens)] = 30.0
        return Draft(tuple(choose(row) for row in logits), logits)


@dataclass
class Served:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finals: dict = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    loop: DecodeLoop | None = None


def serve(model, prompts, k, drafter=None, sampling=None, mode="mixed", chunk=None, joined=(), budget=160):
    """Run every prompt through one DecodeLoop concurrently; `joined` requests enter already running."""
    sched = SchedulerConfig(token_budget=budget, max_window_rows_per_step=W, max_running=len(prompts),
                            num_draft_tokens=k, window=W, mode=mode)
    cache_set = model.new_cache_set(SIZING)
    out = Served()
    loop = DecodeLoop(model, cache_set, sched, eos_token_id=-1, on_step=out.steps.append, window_chunk=chunk,
                      drafter=drafter)
    out.loop = loop
    done, lock = threading.Event(), threading.Lock()

    def emitter(rid):
        def emit(event):
            with lock:
                out.tokens.setdefault(rid, []).extend(event.new_token_ids)
                if event.finished:
                    out.finals[rid] = event
                    if len(out.finals) == len(prompts):
                        done.set()
        return emit

    loop.start()
    try:
        for rid, tokens in prompts.items():
            params = sampling(rid) if sampling else SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0,
                                                                   ignore_eos=True)
            split = SplitPlan(model.cfg, tokens.numel(), W, "asym-exact-encoder")
            if rid in joined:  # the whole prompt ran elsewhere: join with a cache at N and the first token
                def install(cs, tokens=tokens):
                    cache = cs.new_request()
                    model(tokens, cache, logits="none")
                    return cache

                probe = model.new_cache_set(SIZING).new_request()
                first = int(torch.argmax(model(tokens, probe)))
                probe.release()
                loop.submit_running(ActiveRequest(rid, tokens, split, None, params, emitter(rid),
                                                  generator=torch.Generator().manual_seed(5)), first, install)
                continue
            prefix = run_prefix_on_full_model(model, model.new_cache_set(SIZING), tokens, split)
            loop.submit(ActiveRequest(rid, tokens, split, prefix, params, emitter(rid)))
        assert done.wait(120), f"requests did not finish: {set(prompts) - set(out.finals)}"
    finally:
        loop.stop()
    cache_set.check_no_leak()
    return out


@pytest.mark.parametrize("k,corrupt,mode,chunk", [
    (3, (0, 1, 2, 3), "mixed", None),
    (5, (5, 2, 0, 4, 1, 3), "separate", 32),
    (1, (1, 0), "mixed", 7),
], ids=["k3-mixed", "k5-separate-chunk32", "k1-mixed-chunk7"])
def test_greedy_speculation_equals_plain_decoding(model, prompts, reference, k, corrupt, mode, chunk):
    drafter = ReferenceDrafter(prompts, reference, model.cfg.vocab_size, corrupt)
    got = serve(model, prompts, k, drafter, mode=mode, chunk=chunk)
    assert got.tokens == reference
    assert all(e.finish_reason.kind is FinishKind.LENGTH and e.error is None for e in got.finals.values())
    stats = got.loop.acceptance
    assert stats.proposed == sum(s.proposed for s in got.steps) > 0
    assert stats.accepted == sum(s.accepted for s in got.steps)
    assert 0 < stats.accepted < stats.proposed  # drafts are accepted, and the corrupted ones rolled back
    assert stats.emitted == stats.steps + stats.accepted
    # every request: its first token from the window step, the rest from verify (or plain) decode rows
    assert sum(s.emitted for s in got.steps) == len(prompts) * (NEW_TOKENS - 1) >= stats.emitted
    plain = sum(s.emitted for s in got.steps) - stats.emitted
    assert stats.steps + plain < len(prompts) * (NEW_TOKENS - 1)  # fewer decode rows-groups than tokens


def test_random_dspark_drafter_keeps_greedy_tokens(model, prompts, reference, dspark):
    got = serve(model, prompts, 3, dspark, joined=("r129",))
    assert got.tokens == reference
    stats = got.loop.acceptance
    assert stats.proposed > 0 and stats.emitted == stats.steps + stats.accepted
    assert len(stats.per_position()) == 3


def test_seeded_sampling_with_speculation(model, prompts, dspark):
    def params(seed):
        return lambda rid: SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.9, top_k=8, seed=seed + len(rid),
                                          ignore_eos=True)

    first = serve(model, prompts, 3, dspark, sampling=params(1))
    again = serve(model, prompts, 3, dspark, sampling=params(1), mode="separate")
    other = serve(model, prompts, 3, dspark, sampling=params(2))
    assert first.tokens == again.tokens  # a seed fixes the output, whatever the step layout
    assert first.tokens != other.tokens
    assert first.loop.acceptance.proposed > 0
    for rid, tokens in prompts.items():  # every token is inside the target's top-8 where it was drawn
        out = first.tokens[rid]
        assert len(out) == NEW_TOKENS
        split = SplitPlan(model.cfg, tokens.numel(), W, "asym-exact-encoder")
        prefix = run_prefix_on_full_model(model, model.new_cache_set(SIZING), tokens, split)
        cache = install_prefix(model, model.new_cache_set(SIZING), prefix, split)
        logits = model(torch.cat([tokens[split.boundary :], torch.tensor(out[:-1])]), cache, logits="all")
        logits = logits[-NEW_TOKENS:]
        top = logits.topk(8, dim=-1).indices
        assert all(t in top[i].tolist() for i, t in enumerate(out)), rid
        cache.release()


def test_bad_speculative_settings_are_refused(model, dspark):
    cache_set = model.new_cache_set(SIZING)
    sched = SchedulerConfig(token_budget=64, max_window_rows_per_step=W, max_running=4, num_draft_tokens=3, window=W)
    with pytest.raises(ValueError, match="needs a drafter"):
        DecodeLoop(model, cache_set, sched, eos_token_id=-1)
    too_many = SchedulerConfig(token_budget=64, max_window_rows_per_step=W, max_running=4, num_draft_tokens=6,
                               window=W)
    with pytest.raises(ValueError, match=r"k \(draft tokens per step\) must be an integer in \[1, 5\]"):
        DecodeLoop(model, cache_set, too_many, eos_token_id=-1, drafter=dspark)
    plain = SchedulerConfig(token_budget=64, max_window_rows_per_step=W, max_running=4, num_draft_tokens=0, window=W)
    assert DecodeLoop(model, cache_set, plain, eos_token_id=-1, drafter=dspark).drafter is None


# ---- the server's flag and the engines' drafter -------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from sglang_asym.checkpoint.writer import write_checkpoint
    from sglang_asym.config import V41Config

    with_drafter, without = tmp_path_factory.mktemp("with_mtp"), tmp_path_factory.mktemp("without_mtp")
    write_checkpoint(with_drafter, V41Config.tiny(), seed=3, precision="release", progress=False)
    write_checkpoint(without, V41Config.tiny(), seed=3, precision="release", include_extras=False, progress=False)
    return with_drafter, without


def test_launch_flag_is_validated_against_the_checkpoint(checkpoints):
    from sglang_asym.launch_server import build_parser, engine_options, validate

    with_drafter, without = checkpoints

    def args(path, k):
        return build_parser().parse_args(["--model-path", str(path), "--speculative-num-draft-tokens", str(k),
                                          "--max-running-requests", "8", "--decode-token-budget", "16",
                                          "--asym-window", "32"])

    ok = args(with_drafter, 5)
    validate(ok)
    sched = engine_options(ok).scheduler
    assert sched.num_draft_tokens == 5 and sched.token_budget == 8 * 6  # a full batch of 1 + k verifies fits
    with pytest.raises(SystemExit, match=r"must be in \[0, 5\] for this checkpoint .*dspark_block_size=5"):
        validate(args(with_drafter, 6))
    with pytest.raises(SystemExit, match=r">= 0 \(0 turns speculative decoding off\)"):
        validate(args(with_drafter, -1))
    with pytest.raises(SystemExit, match=r"no drafter weights: \d+ mtp\.\* tensor\(s\) missing, e\.g\. \['mtp\.0\."):
        validate(args(without, 3))
    validate(args(without, 0))  # plain decoding needs no drafter


def test_colocated_engine_serves_speculative_greedy_tokens(checkpoints):
    import asyncio

    from sglang_asym.model.loading import model_from_checkpoint
    from sglang_asym.runtime.engine.colocated import ColocatedEngine
    from sglang_asym.runtime.engine.options import EngineOptions
    from sglang_asym.runtime.engine_api import GenerateRequest

    path = str(checkpoints[0])
    model = model_from_checkpoint(path, cache_quant="release")
    prompts = [prompt(model.cfg, n, seed=n) for n in (3, 140)]

    def run(k):
        sched = SchedulerConfig(token_budget=64, max_window_rows_per_step=W, max_running=4, num_draft_tokens=k,
                                window=W)
        engine = ColocatedEngine(model, EngineOptions(model_path=path, max_total_tokens=512, max_running=4,
                                                      scheduler=sched))

        async def one(i, p):
            tokens = []
            req = GenerateRequest(f"s{i}", tuple(p.tolist()),
                                  SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True))
            async for event in engine.generate(req):
                tokens += event.new_token_ids
            return tokens

        async def both():
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

        try:
            return asyncio.run(both()), engine.loop.acceptance
        finally:
            engine.shutdown()

    plain, _ = run(0)
    spec, stats = run(3)
    assert spec == plain and all(len(t) == 12 for t in spec)
    assert stats.proposed > 0 and stats.emitted == stats.steps + stats.accepted

