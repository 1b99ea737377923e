"""Build a random tiny model in NVIDIA's implementation (oracle venv) and load it here."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from oracle_runner import run_oracle  # noqa: E402

from sglang_asym.config import V41Config  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "nemo_v41_script.py"


@dataclass(frozen=True)
class OracleCase:
    input_ids: torch.Tensor  # [N]
    logits_none: torch.Tensor  # [N, V]
    logits_release: torch.Tensor  # [N, V]


@lru_cache(maxsize=None)
def oracle_run(seed: int, seq_lens: tuple[int, ...]) -> tuple[dict[str, torch.Tensor], tuple[OracleCase, ...]]:
    """One oracle process: a random tiny model (seed), its released-name weights, and its logits
    for one random prompt per length."""
    cfg = V41Config.tiny()
    config_bytes = torch.tensor(list(json.dumps(cfg.to_hf_dict()).encode()), dtype=torch.uint8)
    inputs = {"config_json": config_bytes, "seed": torch.tensor([seed])}
    for n in seq_lens:
        inputs[f"input_ids.{n}"] = torch.randint(0, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
    out = run_oracle(SCRIPT, inputs, timeout_s=900)
    weights = {k[2:]: v for k, v in out.items() if k.startswith("w.")}
    cases = tuple(OracleCase(inputs[f"input_ids.{n}"][0], out[f"logits_none.{n}"][0], out[f"logits_release.{n}"][0])
                  for n in seq_lens)
    return weights, cases
