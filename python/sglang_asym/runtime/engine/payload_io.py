"""Prefix rows <-> wire rows, and the transfer compatibility record both workers build.

Wire row formats: `model` ships rows as raw tensors in the model dtype (exactness tests); `release`
packs them in the released cache formats (window KV FP8 e4m3 + ue8m0, main KV NVFP4, index keys
MXFP4). Packing the release formats is lossless when the model already quantizes its caches
(`--cache-quant release`), because the formats' fake quantization is idempotent. Compressor tails
always travel as fp32 value + gate."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from ...config import V41Config
from ...formats import pack_rows, unpack_rows
from ...manifest import PayloadManifest
from ...split import ROW_FORMATS, SplitPlan
from ...transfer import RowFormat, TransferCompat

_RELEASE_FORMAT = {"kv": "nvfp4", "index": "mxfp4", "swa": "fp8"}


def group_kind(group: str) -> str:
    return group.split(".L")[0]


def all_groups_plan(cfg: V41Config, window: int, semantics: str) -> SplitPlan:
    """A split whose manifest holds every group this config can ever ship (odd B, encoder rows)."""
    return SplitPlan(cfg, window + 3, window, semantics if semantics != "asym" else "asym-exact-encoder")


def transfer_compat(cfg: V41Config, window: int, semantics: str, row_format: str, dtype: torch.dtype,
                    manifest: PayloadManifest | None = None,
                    extra_encodings: Mapping[str, str] | None = None) -> TransferCompat:
    """`manifest`: every group the workers may ever ship (default: the asymmetric split's);
    `extra_encodings`: encodings of groups that are not cache rows (by group kind)."""
    if row_format not in ROW_FORMATS:
        raise ValueError(f"row format must be one of {ROW_FORMATS}, got {row_format!r}")
    if manifest is None:
        manifest = all_groups_plan(cfg, window, semantics).manifest(row_format, dtype)
    encodings = {kind: (f"{_RELEASE_FORMAT[kind]}" if row_format == "release" else str(dtype).replace("torch.", ""))
                 for kind in _RELEASE_FORMAT}
    encodings["tail"] = "float32-value-gate"
    encodings.update(extra_encodings or {})
    formats = tuple(RowFormat(g.name, g.row_bytes, encodings[group_kind(g.name)]) for g in manifest.groups)
    return TransferCompat(model_config_hash=cfg.fingerprint(), row_formats=formats, page_size=1, window=window,
                          semantics=semantics)


def encode_rows(group: str, rows: torch.Tensor, row_format: str) -> np.ndarray:
    """[n, C] tensor rows (tails: [2, C] for one row) -> uint8 [n, row_bytes]."""
    kind = group_kind(group)
    if kind == "tail":
        return rows.float().contiguous().view(1, -1).view(torch.uint8).numpy()
    if row_format == "release":
        return pack_rows(rows.float(), _RELEASE_FORMAT[kind]).numpy()
    return rows.contiguous().view(torch.uint8).numpy()


def decode_rows(group: str, data: np.ndarray, row_format: str, cfg: V41Config, dtype: torch.dtype) -> torch.Tensor:
    """uint8 [n, row_bytes] -> rows as the decode role's cache holds them."""
    kind = group_kind(group)
    raw = torch.from_numpy(np.ascontiguousarray(data))
    if raw.numel() == 0:  # numpy gives empty arrays zero strides, which torch cannot reinterpret
        raw = torch.empty(raw.shape, dtype=torch.uint8)
    if kind == "tail":
        return raw.view(torch.float32).view(2, cfg.head_dim).clone()
    channels = cfg.index_head_dim if kind == "index" else cfg.head_dim
    if row_format == "release":
        return unpack_rows(raw, _RELEASE_FORMAT[kind], channels).to(dtype)
    return raw.view(dtype).view(-1, channels).clone()
