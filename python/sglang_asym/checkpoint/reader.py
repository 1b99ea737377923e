"""Lazy, role-aware checkpoint reading: load_weights(dir, names | role) -> dict of float tensors.

Only the shards that hold requested tensors are opened, only those tensors (and their scales) are
read, and FP8/FP4 weights are dequantized on the way. Tensors are keyed by released names. Roles:
  prefill  LayerPlan.prefill_tensor_names (embeddings, encoder layers, the last KV source's KV path)
  decode   every backbone tensor
Tensors the request does not cover (the DSpark draft `mtp.*`, Engram, vision, or names this project
does not know) are skipped with a debug log.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import safe_open
from tqdm import tqdm

from ..config import ConfigError, V41Config
from ..layer_plan import LayerPlan
from ..tensor_specs import TensorSpec
from . import formats
from .errors import CheckpointError
from .layout import INDEX_FILE, SINGLE_FILE
from .specs import checkpoint_tensor_specs, scale_name
from .threads import single_threaded

log = logging.getLogger(__name__)

ROLES = ("prefill", "decode")

_SAFETENSORS_DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "I8": torch.int8,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
}
_FLOAT_STORAGE = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


@dataclass(frozen=True)
class LoadStats:
    role: str | None
    tensors_requested: int
    tensors_read: int  # weights and scales read from disk
    bytes_read: int  # their stored bytes
    shards_opened: tuple[str, ...]
    shards_total: int
    seconds: float


def read_checkpoint_config(directory: Path) -> V41Config:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: no config.json in the checkpoint directory")
    try:
        raw = json.loads(path.read_text())
        return V41Config.from_hf_dict(raw)
    except (json.JSONDecodeError, ConfigError) as exc:
        raise CheckpointError(f"{path}: {exc}") from exc


class CheckpointReader:
    """One checkpoint directory: its config, its tensor -> file map, and lazy role-aware loads."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise CheckpointError(f"{self.directory}: checkpoint directory does not exist")
        self.config = read_checkpoint_config(self.directory)
        self.plan = LayerPlan.from_config(self.config)
        self._specs: dict[str, TensorSpec] = {s.name: s for s in checkpoint_tensor_specs(self.config)}
        self.map_source, self.weight_map = self._read_weight_map()
        self.stats: LoadStats | None = None

    # ---- where each tensor lives ---------------------------------------------------------------
    def _read_weight_map(self) -> tuple[Path, dict[str, str]]:
        index = self.directory / INDEX_FILE
        if index.is_file():
            try:
                raw = json.loads(index.read_text())
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{index}: not valid JSON: {exc}") from exc
            weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
            if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
            ):
                raise CheckpointError(f"{index}: needs a \"weight_map\" object of tensor name -> shard file")
            return index, dict(weight_map)
        single = self.directory / SINGLE_FILE
        if single.is_file():
            with safe_open(str(single), framework="pt") as f:
                return single, dict.fromkeys(f.keys(), SINGLE_FILE)
        raise CheckpointError(f"{self.directory}: neither {INDEX_FILE} nor {SINGLE_FILE} found")

    def names_for_role(self, role: str) -> frozenset[str]:
        if role == "prefill":
            return self.plan.prefill_tensor_names
        if role == "decode":
            return frozenset(self.plan.all_tensor_names)
        raise CheckpointError(f"unknown role {role!r}; choose one of {ROLES}")

    # ---- loading -------------------------------------------------------------------------------
    def load(
        self,
        names: Iterable[str] | None = None,
        *,
        role: str | None = None,
        dtype: torch.dtype = torch.float32,
        progress: bool = True,
    ) -> dict[str, torch.Tensor]:
        """Dequantized `dtype` tensors for `names`, or for `role` (default: decode = full backbone)."""
        start = time.perf_counter()
        if names is not None and role is not None:
            raise CheckpointError("pass either names or role, not both")
        if dtype not in _FLOAT_STORAGE:
            raise CheckpointError(f"dtype must be a float dtype {_FLOAT_STORAGE}, got {dtype}")
        if names is None and role is None:
            role = "decode"
        wanted = set(names) if names is not None else set(self.names_for_role(role))
        purpose = f"the {role} role" if role else "this load"
        unknown = sorted(n for n in wanted if n not in self._specs)
        if unknown:
            raise CheckpointError(
                f"{self.directory}: tensor {unknown[0]!r} is not a DeepSeek-V4.1 checkpoint tensor for this config"
                + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            )
        missing = [n for n in self._ordered(wanted) if n not in self.weight_map]
        if missing:
            raise CheckpointError(
                f"{self.map_source}: tensor {missing[0]!r} needed by {purpose} is missing from the checkpoint"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        scales = {n: scale_name(n) for n in wanted if n.endswith(".weight") and scale_name(n) in self.weight_map}
        self._check_shard_files(wanted | set(scales.values()))
        ignored = set(self.weight_map) - wanted - set(scales.values())
        if ignored:
            log.debug("%s: skipping %d checkpoint tensors not requested by %s (e.g. %s)",
                      self.directory, len(ignored), purpose, sorted(ignored)[:3])

        session = _ReadSession(self.directory)
        out: dict[str, torch.Tensor] = {}
        order = sorted(self._ordered(wanted), key=lambda n: self.weight_map[n])  # shard by shard
        # Each shard is closed right after its last use, so at most a few files are mapped at once.
        last_use: dict[str, int] = {}
        for position, name in enumerate(order):
            last_use[self.weight_map[name]] = position
            if name in scales:
                last_use[self.weight_map[scales[name]]] = position
        closing_at: dict[int, list[str]] = {}
        for file_name, position in last_use.items():
            closing_at.setdefault(position, []).append(file_name)
        bar = tqdm(total=len(order), desc=f"loading {role or 'weights'}", unit="tensor",
                   file=sys.stderr, disable=not progress)
        with session, bar, single_threaded():
            for position, name in enumerate(order):
                out[name] = self._load_one(session, name, scales.get(name), dtype)
                for file_name in closing_at.get(position, ()):
                    session.close(file_name)
                bar.update(1)
        self.stats = LoadStats(
            role=role,
            tensors_requested=len(wanted),
            tensors_read=session.tensors_read,
            bytes_read=session.bytes_read,
            shards_opened=tuple(session.opened),
            shards_total=len(set(self.weight_map.values())),
            seconds=time.perf_counter() - start,
        )
        return out

    def _ordered(self, names: set[str]) -> list[str]:
        return [n for n in self._specs if n in names]

    def _check_shard_files(self, names: set[str]) -> None:
        by_file: dict[str, list[str]] = {}
        for n in sorted(names):
            by_file.setdefault(self.weight_map[n], []).append(n)
        for file_name, held in by_file.items():
            if not (self.directory / file_name).is_file():
                raise CheckpointError(
                    f"{self.directory / file_name}: shard file missing; {self.map_source.name} maps tensor "
                    f"{held[0]!r} there" + (f" (and {len(held) - 1} more requested)" if len(held) > 1 else "")
                )

    def _load_one(self, session: "_ReadSession", name: str, scale: str | None, dtype: torch.dtype) -> torch.Tensor:
        spec = self._specs[name]
        file_name = self.weight_map[name]
        stored_dtype, shape = session.meta(file_name, name, self.map_source)
        where = f"{self.directory / file_name}: tensor {name!r}"
        if stored_dtype in _FLOAT_STORAGE:
            if shape != spec.shape:
                raise CheckpointError(f"{where} has shape {list(shape)}, expected {list(spec.shape)} for this config")
            if scale is not None:
                raise CheckpointError(
                    f"{where} is stored as {stored_dtype} but has a scale tensor {scale!r}; "
                    "only FP8/FP4 weights carry scales"
                )
            # Always copy: keeping safetensors' own read buffers alive fragments the heap
            # (measured +50 MB resident on the small model's prefill role).
            return session.read(file_name, name).to(dtype, copy=True)
        quantized_kinds = {torch.float8_e4m3fn: ("fp8", "fp8_rows"), torch.int8: ("fp4",)}
        if spec.kind not in quantized_kinds.get(stored_dtype, ()):
            raise CheckpointError(
                f"{where} is stored as {stored_dtype}, but the released format stores it as {spec.kind}"
            )
        rows, cols = spec.shape
        if spec.kind == "fp4":
            expected_shape, expected_scale = formats.packed_fp4_shape(rows, cols), formats.row_scale_shape(rows, cols)
        elif spec.kind == "fp8_rows":
            expected_shape, expected_scale = spec.shape, formats.row_scale_shape(rows, cols)
        else:
            expected_shape, expected_scale = spec.shape, formats.fp8_block_scale_shape(rows, cols)
        if shape != expected_shape:
            raise CheckpointError(
                f"{where} has {stored_dtype} shape {list(shape)}, expected {list(expected_shape)} "
                f"({spec.kind} of logical shape {list(spec.shape)})"
            )
        if scale is None:
            raise CheckpointError(f"{where} is {stored_dtype} but its scale tensor {scale_name(name)!r} is missing")
        scale_file = self.weight_map[scale]
        scale_dtype, scale_shape = session.meta(scale_file, scale, self.map_source)
        if scale_dtype != torch.float8_e8m0fnu or scale_shape != expected_scale:
            raise CheckpointError(
                f"{self.directory / scale_file}: scale {scale!r} of {name!r} is {scale_dtype} {list(scale_shape)}, "
                f"expected float8_e8m0fnu {list(expected_scale)}"
            )
        weight, scale_tensor = session.read(file_name, name), session.read(scale_file, scale)
        try:
            if spec.kind == "fp4":
                return formats.dequantize_fp4(weight, scale_tensor, dtype)
            row_block = 1 if spec.kind == "fp8_rows" else formats.BLOCK
            return formats.dequantize_fp8(weight, scale_tensor, dtype, row_block=row_block)
        except ValueError as exc:
            raise CheckpointError(f"{self.directory / scale_file}: scale {scale!r} of {name!r}: {exc}") from exc


class _ReadSession:
    """Open shard handles for one load, opened on first use, with read accounting."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._handles: dict[str, Any] = {}
        self._keys: dict[str, set[str]] = {}
        self.opened: list[str] = []
        self.tensors_read = 0
        self.bytes_read = 0

    def __enter__(self) -> "_ReadSession":
        return self

    def __exit__(self, *exc: object) -> None:
        for file_name in list(self._handles):
            self.close(file_name)

    def close(self, file_name: str) -> None:
        handle = self._handles.pop(file_name, None)
        if handle is not None:
            handle.__exit__(None, None, None)

    def _handle(self, file_name: str) -> Any:
        if file_name not in self._handles:
            path = self.directory / file_name
            try:
                handle = safe_open(str(path), framework="pt")
                handle.__enter__()
            except Exception as exc:  # safetensors raises its own error types for corrupt headers
                raise CheckpointError(f"{path}: cannot open as safetensors: {exc}") from exc
            self._handles[file_name] = handle
            if file_name not in self._keys:
                self._keys[file_name] = set(handle.keys())
                self.opened.append(file_name)
        return self._handles[file_name]

    def meta(self, file_name: str, name: str, map_source: Path) -> tuple[torch.dtype, tuple[int, ...]]:
        handle = self._handle(file_name)
        if name not in self._keys[file_name]:
            raise CheckpointError(
                f"{self.directory / file_name}: tensor {name!r} is absent although {map_source.name} "
                "maps it to this file"
            )
        view = handle.get_slice(name)
        raw_dtype = view.get_dtype()
        stored = _SAFETENSORS_DTYPES.get(raw_dtype)
        if stored is None:
            raise CheckpointError(f"{self.directory / file_name}: tensor {name!r} has unsupported dtype {raw_dtype}")
        return stored, tuple(view.get_shape())

    def read(self, file_name: str, name: str) -> torch.Tensor:
        tensor = self._handle(file_name).get_tensor(name)
        self.tensors_read += 1
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor


def load_weights(
    directory: str | Path,
    names: Iterable[str] | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    role: str | None = None,
    progress: bool = True,
) -> dict[str, torch.Tensor]:
    """Dequantized tensors of a checkpoint directory; see CheckpointReader.load."""
    return CheckpointReader(directory).load(names, role=role, dtype=dtype, progress=progress)
