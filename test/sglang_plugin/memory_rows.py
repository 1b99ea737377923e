"""Stand-ins for reference-forward tests without servers: PoolRows (sglang_plugin/shared/pool_rows.py) in memory,
and the ForwardMode predicates the reference forward asks."""

from __future__ import annotations

import torch

from sglang_asym.formats import pack_rows, unpack_rows

_FORMAT = {"kv": "nvfp4", "index": "mxfp4"}


class MemoryRows:
    """PoolRows' reads and writes over dicts: rows stored packed in the pool's formats (fp8 window rows,
    nvfp4 compressed rows, mxfp4 index keys, fp32 pending tokens), so values round-trip as through SGLang's pool."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.ratio = {o: cfg.compress_ratios[o] for o in cfg.kv_source_layer_ids}
        self.rows: dict[tuple, torch.Tensor] = {}

    def _read(self, key: tuple, start: int, end: int, fmt: str, channels: int, dtype: torch.dtype) -> torch.Tensor:
        if end <= start:
            return torch.empty(0, channels, dtype=dtype)
        return unpack_rows(torch.stack([self.rows[(*key, t)] for t in range(start, end)]), fmt, channels).to(dtype)

    def _write(self, key: tuple, start: int, values: torch.Tensor, fmt: str) -> None:
        for i, row in enumerate(pack_rows(values.float(), fmt) if values.shape[0] else ()):
            self.rows[(*key, start + i)] = row.clone()

    def read_window(self, layer, req, start, end, dtype):
        return self._read(("swa", layer, req), start, end, "fp8", self.cfg.head_dim, dtype)

    def write_window(self, layer, req, start, values):
        self._write(("swa", layer, req), start, values, "fp8")

    def _channels(self, kind: str) -> int:
        return self.cfg.head_dim if kind == "kv" else self.cfg.index_head_dim

    def read_compressed(self, kind, owner, req, end, dtype):
        return self._read((kind, owner, req), 0, end, _FORMAT[kind], self._channels(kind), dtype)

    def write_compressed(self, kind, owner, req, first_row, values):
        self._write((kind, owner, req), first_row, values, _FORMAT[kind])

    def read_tail(self, owner, req, token):
        return self.rows[("tail", owner, req, token)].clone()

    def write_tail(self, owner, req, token, value):
        self.rows[("tail", owner, req, token)] = value.float().reshape(2, -1).clone()


class Mode:
    """SGLang's ForwardMode as the reference forward asks it ("decode", "extend" or "verify"; as in SGLang, a
    verify batch is also an extend)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def is_decode(self) -> bool:
        return self.name == "decode"

    def is_target_verify(self) -> bool:
        return self.name == "verify"

    def is_extend(self) -> bool:
        return self.name in ("extend", "verify")

    def is_idle(self) -> bool:
        return False
