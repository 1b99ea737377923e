"""Checkpoints in the released DeepSeek-V4.1 layout: random generation, writing, lazy role-aware reading.

    random_weights(cfg, seed)                  float32 backbone tensors, no disk
    write_checkpoint(dir, cfg, seed, ...)      config.json + safetensors shards (+ index)
    write_tokenizer(dir, cfg)                  byte-level BPE loadable by transformers.AutoTokenizer
    load_weights(dir, names | role=...)        dict[str, Tensor], dequantized
"""

from .errors import CheckpointError
from .random_init import random_tensor, random_weights, snap_to_precision
from .reader import CheckpointReader, LoadStats, load_weights, read_checkpoint_config
from .specs import PRECISIONS, checkpoint_tensor_specs, dspark_tensor_specs, engram_tensor_specs, scale_name
from .tokenizer import write_tokenizer
from .writer import WriteSummary, encode_for_disk, write_checkpoint

__all__ = [
    "PRECISIONS",
    "CheckpointError",
    "CheckpointReader",
    "LoadStats",
    "WriteSummary",
    "checkpoint_tensor_specs",
    "dspark_tensor_specs",
    "encode_for_disk",
    "engram_tensor_specs",
    "load_weights",
    "random_tensor",
    "random_weights",
    "read_checkpoint_config",
    "scale_name",
    "snap_to_precision",
    "write_checkpoint",
    "write_tokenizer",
]
