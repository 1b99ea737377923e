"""Prefix rows <-> wire rows, and the transfer compatibility record both workers build.

Wire row formats: `model` ships rows as raw tensors in the model dtype (exactness tests); `release`
packs them in the released cache formats (window KV FP8 e4m3 + ue8m0, main KV NVFP4, index keys
MXFP4); `v4` packs both KV caches as SGLang's V4 layout (fp8 nope + bf16 rope). Packing is lossless
when the model already quantizes its caches the same way (`--cache-quant release` / `v4`), because
the formats' fake quantization is idempotent. Compressor tails always travel as fp32 value + gate."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from ...cache import KIND_FORMATS, cache_group, parse_group
from ...cache.groups import TAIL_ENCODING
from ...config import V41Config
from ...manifest import PayloadManifest
from ...split import ROW_FORMATS, SplitPlan
from ...transfer import RowFormat, TransferCompat

def all_groups_plan(cfg: V41Config, window: int, semantics: str) -> SplitPlan:
    """A split whose manifest holds every group this config can ever ship (odd B, encoder rows)."""
    return SplitPlan(cfg, window + 3, window, semantics if semantics != "asym" else "asym-exact-encoder")


def transfer_compat(cfg: V41Config, window: int, semantics: str, row_format: str, dtype: torch.dtype,
                    manifest: PayloadManifest | None = None,
                    extra_encodings: Mapping[str, str] | None = None) -> TransferCompat:
    """`manifest`: every group the workers may ever ship (default: the asymmetric split's);
    `extra_encodings`: encodings of groups that are not cache rows (by group name)."""
    if row_format not in ROW_FORMATS:
        raise ValueError(f"row format must be one of {ROW_FORMATS}, got {row_format!r}")
    if manifest is None:
        manifest = all_groups_plan(cfg, window, semantics).manifest(row_format, dtype)
    model_encoding = str(dtype).replace("torch.", "")
    encodings = {kind: TAIL_ENCODING if fmt.release is None else model_encoding if row_format == "model"
                 else getattr(fmt, row_format) for kind, fmt in KIND_FORMATS.items()}
    extra = dict(extra_encodings or {})

    def encoding(name: str) -> str:
        group = cache_group(name)
        return extra[name] if group is None else encodings[group.kind]

    formats = tuple(RowFormat(g.name, g.row_bytes, encoding(g.name)) for g in manifest.groups)
    return TransferCompat(model_config_hash=cfg.fingerprint(), row_formats=formats, page_size=1, window=window,
                          semantics=semantics)


def encode_rows(group: str, rows: torch.Tensor, row_format: str, cfg: V41Config) -> np.ndarray:
    """[n, C] tensor rows (tails: [2, C] for one row) -> uint8 [n, row_bytes]."""
    fmt = parse_group(group).format
    if fmt.release is None:  # a compressor tail: fp32 value and gate
        return rows.float().contiguous().view(1, -1).view(torch.uint8).numpy()
    packed = fmt.packed(row_format, cfg)
    if packed is not None:
        return packed.pack_rows(rows.float()).numpy()
    return rows.contiguous().view(torch.uint8).numpy()


def decode_rows(group: str, data: np.ndarray, row_format: str, cfg: V41Config, dtype: torch.dtype) -> torch.Tensor:
    """uint8 [n, row_bytes] -> rows as the decode role's cache holds them."""
    fmt = parse_group(group).format
    packed = fmt.packed(row_format, cfg)
    raw = torch.from_numpy(np.ascontiguousarray(data))
    if raw.numel() == 0:  # numpy gives empty arrays zero strides, which torch cannot reinterpret
        raw = torch.empty(raw.shape, dtype=torch.uint8)
    channels = fmt.channels(cfg)
    if fmt.release is None:  # a compressor tail: fp32 value and gate
        return raw.view(torch.float32).view(2, channels).clone()
    if packed is not None:
        return packed.unpack_rows(raw, channels).to(dtype)
    return raw.view(dtype).view(-1, channels).clone()
