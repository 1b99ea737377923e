"""A small deterministic byte-level BPE tokenizer for random checkpoints, with a chat template.

Loadable offline by `transformers.AutoTokenizer.from_pretrained(dir)` and by
`tokenizers.Tokenizer.from_file`. Special tokens sit at the config's bos/eos/pad ids (they must be
0, 1 and 2 in some order), then the two chat-role markers; merges are trained on a fixed built-in
corpus (or the texts a caller passes, e.g. a trained checkpoint's training text), so the same config
and corpus always yield the same tokenizer.json. The vocabulary never exceeds the config's vocab_size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from ..config import V41Config
from .errors import CheckpointError

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}" + USER + "{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}" + ASSISTANT + "{{ message['content'] }}{{ eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)

_CORPUS = (
    "The prefill worker computes the prompt up to the boundary and ships the compressed rows.",
    "The decode worker replays the last window of the prompt through every layer, then decodes.",
    "A sliding window of one hundred and twenty eight tokens keeps the recent keys exact.",
    "Compressed key rows are selected by the indexer; the top rows join the window in one softmax.",
    "Experts are chosen per token: six of three hundred and eighty four, plus one shared expert.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096 8192 65536 1048576.",
    "def forward(self, x):\n    return self.norm(x) * self.weight + self.bias\n",
    "Questions and answers: What is the capital of France? Paris. How many days are in a week? Seven.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun.",
    "Un petit texte en français, ein kurzer deutscher Satz, y una frase en español para variar.",
    "数据在预填充节点上计算，然后传输到解码节点。",
    "Hello, world! This is a test of the tokenizer: commas, periods. Semicolons; colons: (and) [brackets].",
)


def _special_tokens(cfg: V41Config) -> list[str]:
    by_id = {cfg.bos_token_id: BOS, cfg.eos_token_id: EOS, cfg.pad_token_id: PAD}
    if sorted(by_id) != [0, 1, 2]:
        raise CheckpointError(
            f"test tokenizers place bos/eos/pad at ids 0-2; config has bos={cfg.bos_token_id}, "
            f"eos={cfg.eos_token_id}, pad={cfg.pad_token_id}"
        )
    return [by_id[i] for i in range(3)] + [USER, ASSISTANT]


def build_tokenizer(cfg: V41Config, corpus: Sequence[str] | None = None) -> Tokenizer:
    """Merges learned from `corpus` (default: the built-in sentences, repeated four times)."""
    specials = _special_tokens(cfg)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if cfg.vocab_size < len(specials) + len(alphabet):
        raise CheckpointError(
            f"vocab_size {cfg.vocab_size} is too small for a byte-level tokenizer "
            f"({len(alphabet)} bytes + {len(specials)} special tokens)"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(list(_CORPUS) * 4 if corpus is None else list(corpus), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, cfg.bos_token_id)]
    )
    return tok


def write_tokenizer(out_dir: str | Path, cfg: V41Config, tokenizer: Tokenizer | None = None) -> Path:
    """tokenizer.json, tokenizer_config.json (chat template) and special_tokens_map.json into out_dir
    (`tokenizer`: one from build_tokenizer with a corpus; default the built-in one)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(cfg) if tokenizer is None else tokenizer
    if tok.get_vocab_size() > cfg.vocab_size:
        raise CheckpointError(f"tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size {cfg.vocab_size}")
    tok.save(str(out / "tokenizer.json"))
    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "additional_special_tokens": [USER, ASSISTANT]}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2, ensure_ascii=False) + "\n")
    return out
