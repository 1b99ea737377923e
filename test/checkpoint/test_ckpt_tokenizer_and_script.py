"""scripts/make_checkpoint.py end to end, and its tokenizer loaded offline by transformers.

AutoTokenizer runs in the oracle venv: transformers is not a project dependency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from sglang_asym.checkpoint import load_weights, random_weights
from sglang_asym.checkpoint.tokenizer import ASSISTANT, BOS, EOS, PAD, USER, build_tokenizer
from sglang_asym.config import V41Config

REPO = Path(__file__).resolve().parents[2]
ORACLE_PYTHON = REPO / ".venv-oracle" / "bin" / "python"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("made_tiny")
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_checkpoint.py"), "--config", "tiny", "--seed", "3",
         "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    report = json.loads(proc.stdout)
    assert report["files"] == ["model.safetensors"] and report["precision"] == "release"
    return out


def test_script_writes_loadable_checkpoint(tiny_dir):
    assert sorted(p.name for p in tiny_dir.iterdir()) == [
        "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
    ]
    assert V41Config.from_json_file(tiny_dir) == V41Config.tiny()
    loaded = load_weights(tiny_dir, ["layers.3.ffn.experts.1.w3.weight"], progress=False)
    expected = random_weights(V41Config.tiny(), 3, precision="release", names=loaded)
    assert loaded.keys() == expected.keys()
    assert all(bool((loaded[n] == expected[n]).all()) for n in loaded)


def test_tokenizer_is_deterministic_and_fits_vocab(tiny_dir):
    for preset in ("tiny", "small", "flash"):
        cfg = V41Config.preset(preset)
        tok = build_tokenizer(cfg)
        assert tok.to_str() == build_tokenizer(cfg).to_str()
        assert tok.get_vocab_size() <= cfg.vocab_size
        assert [tok.token_to_id(t) for t in (BOS, EOS, PAD)] == [cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id]
        assert [tok.token_to_id(t) for t in (USER, ASSISTANT)] == [3, 4]
    on_disk = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    text = "Prefill ships rows. Ünïcödé 数据 ✓"
    ids = on_disk.encode(text).ids
    assert ids[0] == V41Config.tiny().bos_token_id and max(ids) < V41Config.tiny().vocab_size
    assert on_disk.decode(ids) == text


ORACLE_CHECK = r"""
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True)
text = "Prefill ships rows. Ünïcödé 数据 ✓"
ids = tok(text)["input_ids"]
chat = tok.apply_chat_template(
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}],
    tokenize=False, add_generation_prompt=True)
chat_ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True)
if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys"):
    chat_ids = chat_ids["input_ids"]
print(json.dumps({"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id, "len": len(tok),
                  "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True), "chat": chat,
                  "chat_ids": list(chat_ids)}))
"""


def test_autotokenizer_loads_offline(tiny_dir):
    assert ORACLE_PYTHON.exists(), f"{ORACLE_PYTHON} (transformers) is needed for this check: scripts/setup.sh builds it"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tiny_dir / "hf_home"))
    proc = subprocess.run([str(ORACLE_PYTHON), "-c", ORACLE_CHECK, str(tiny_dir)], capture_output=True, text=True,
                          timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    cfg = V41Config.tiny()
    assert (got["bos"], got["eos"], got["pad"]) == (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id)
    assert got["len"] <= cfg.vocab_size
    ours = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert got["ids"] == ours.encode("Prefill ships rows. Ünïcödé 数据 ✓").ids
    assert got["decoded"] == "Prefill ships rows. Ünïcödé 数据 ✓"
    assert got["chat"] == f"{BOS}{USER}hi{ASSISTANT}hello{EOS}{USER}more{ASSISTANT}"
    assert got["chat_ids"][0] == cfg.bos_token_id and got["chat_ids"][-1] == ours.token_to_id(ASSISTANT)
    assert got["chat_ids"].count(cfg.bos_token_id) == 1
