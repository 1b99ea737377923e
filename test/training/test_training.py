"""Training on Python's documentation text: the same seed writes the same checkpoint bytes, the corpus
split, the learning-rate schedule, evaluation arithmetic and writing given weights, with exact values."""

from __future__ import annotations

import hashlib
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from sglang_asym.checkpoint import load_weights, snap_to_precision, write_checkpoint
from sglang_asym.checkpoint.specs import checkpoint_tensor_specs
from sglang_asym.config import V41Config
from sglang_asym.training.corpus import pydoc_corpus, spread_prompts
from sglang_asym.training.evaluate import chunks, unigram_perplexity
from sglang_asym.training.trainer import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _train_script():
    spec = importlib.util.spec_from_file_location("train_small", ROOT / "scripts" / "train_small.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digests(directory: Path) -> dict[str, str]:
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in CHECKPOINT_FILES}


def test_same_seed_same_checkpoint_bytes(tmp_path):
    script = _train_script()
    short = ["--steps", "3", "--batch", "2", "--seq-len", "32", "--no-eval", "--quiet"]
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert script.main(["--out", str(tmp_path / name), "--seed", str(seed), *short]) == 0
        runs[name] = _digests(tmp_path / name)
    assert runs["a"] == runs["b"]
    assert runs["a"]["model.safetensors"] != runs["c"]["model.safetensors"]  # another seed, other weights
    assert runs["a"]["tokenizer.json"] == runs["c"]["tokenizer.json"]  # the tokenizer depends on the text only


def test_corpus_holds_out_every_tenth_paragraph():
    from pydoc_data.topics import topics

    paragraphs = [p for name in sorted(topics) for p in topics[name].strip().split("\n\n") if p.strip()]
    corpus = pydoc_corpus()
    held = [p for text in corpus.heldout for p in text.split("\n\n")]
    assert held == paragraphs[9::10]
    assert len(corpus.train) == len(topics)  # every topic keeps text on the training side
    assert sum(len(t.split("\n\n")) for t in corpus.train) == len(paragraphs) - len(held)


def test_spread_prompts_and_eval_windows():
    stream = torch.arange(10)
    assert [p.tolist() for p in spread_prompts(stream, 4, 3)] == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert [p.tolist() for p in spread_prompts(stream, 10, 1)] == [list(range(10))]
    with pytest.raises(ValueError, match="shorter than one 11-token prompt"):
        spread_prompts(stream, 11, 1)
    assert chunks(stream, 4).tolist() == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]]


def test_unigram_perplexity_by_hand():
    # counts + 1 over vocab 3: token 0 -> 3, 1 -> 2, 2 -> 1 (of 6); targets of the one window: 1, 0
    ppl = unigram_perplexity(torch.tensor([0, 0, 1]), torch.tensor([2, 1, 0]), 3, seq_len=2)
    assert ppl.tokens == 2
    assert ppl.nll == pytest.approx(-(math.log(2 / 6) + math.log(3 / 6)) / 2, abs=1e-12)


def test_learning_rate_schedule():
    cfg = TrainConfig(steps=11, warmup=2, lr=1.0, min_lr_fraction=0.1)
    assert [cfg.lr_at(s) for s in (0, 1)] == [0.5, 1.0]
    assert cfg.lr_at(2) == pytest.approx(1.0)
    assert cfg.lr_at(10) == pytest.approx(0.1)
    assert cfg.lr_at(6) == pytest.approx(0.55)  # half way down the cosine
    with pytest.raises(ValueError, match="steps must be positive"):
        TrainConfig(steps=0)


def test_write_checkpoint_with_given_values(tmp_path):
    cfg = V41Config.tiny()
    specs = {s.name: s for s in checkpoint_tensor_specs(cfg)}
    names = ("embed.weight", "layers.0.ffn.experts.0.w1.weight", "layers.0.attn.wq_a.weight")
    given = {n: torch.full(specs[n].shape, 0.375) for n in names}
    write_checkpoint(tmp_path, cfg, 0, num_shards=1, progress=False, values=given)
    loaded = load_weights(tmp_path, list(names), progress=False)
    for n in names:
        assert torch.equal(loaded[n], snap_to_precision(specs[n], given[n], "release"))
        assert torch.equal(loaded[n], torch.full(specs[n].shape, 0.375))  # 0.375 is exact in FP8, FP4 and bf16
    with pytest.raises(ValueError, match="does not have"):
        write_checkpoint(tmp_path / "x", cfg, 0, progress=False, values={"nope.weight": torch.zeros(1)})


@pytest.mark.parametrize("name", ["v41-sglang-tiny-pydoc", "v41-tiny-pydoc"])
def test_committed_checkpoint_beats_the_unigram_baseline(name):
    """models/v41-sglang-tiny-pydoc (what the demo serves through SGLang's engine: its config is the sglang-tiny
    preset, which SGLang's V4.1 pool holds) and models/v41-tiny-pydoc (the KL benchmark's) load at release
    precision and, on the first 2048 held-out tokens, have a perplexity under a quarter of the unigram
    baseline's."""
    from tokenizers import Tokenizer

    from sglang_asym.config import V41Config
    from sglang_asym.model.loading import model_from_checkpoint
    from sglang_asym.sglang_plugin.shared.servable import pool_geometry_problems
    from sglang_asym.training.corpus import token_stream
    from sglang_asym.training.evaluate import model_perplexity

    directory = ROOT / "models" / name
    model = model_from_checkpoint(directory, cache_quant="release")
    if name == "v41-sglang-tiny-pydoc":
        assert model.cfg == V41Config.sglang_tiny() and pool_geometry_problems(model.cfg) == ()
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    corpus = pydoc_corpus()
    train = token_stream(tokenizer, corpus.train, model.cfg.bos_token_id)
    heldout = token_stream(tokenizer, corpus.heldout, model.cfg.bos_token_id)[: 2048 + 1]
    ppl = model_perplexity(model, heldout, seq_len=256)
    unigram = unigram_perplexity(train, heldout, model.cfg.vocab_size, seq_len=256)
    assert ppl.tokens == unigram.tokens == 2048
    assert ppl.value < unigram.value / 4
