"""The reference model's weights taken from SGLang's loaded DeepseekV4ForCausalLM (no second read).

SGLang's loader reads the checkpoint once into its own parameters (shared/weight_names.py says where each
released tensor lands: fused `wqkv_a` / `wkv_gate` / `gate_up_proj`, stacked experts, FP8 / FP4
codes and scales kept raw, `wo_a` dequantized to bf16). `released_tensors` inverts that mapping: each
released tensor is cut back out of its SGLang parameter (fused and stacked parameters split along
dim 0 in the released order) and dequantized with the checkpoint codecs, exactly as the reference
reader would dequantize the file. `reference_model_from_sglang` fills a V41Model with them.

Two exceptions: SGLang keeps the compressors' `wkv` / `wgate` and the LM head (fp32 in the checkpoint)
in bf16 (the head takes the server's default dtype), which rounds them. Those few tensors are read
from the checkpoint itself, so the reference model computes with the released values (a bf16-rounded
head moves every logit by about 0.005, enough to flip a near tie against the reference model).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping

import torch

from ...checkpoint import formats, load_weights
from ...checkpoint.specs import checkpoint_tensor_specs, scale_name
from ...config import V41Config
from ...model import V41Model
from ..shared.weight_names import LoadTarget, load_target

# order of the parts fused into one SGLang parameter (weight_names' shards)
_SHARD_ORDER = {"q": 0, "kv": 1, "gate": 1, "up": 1, "w1": 0, "w3": 1, "w2": 0}
_SHARD_ORDER_COMPRESSOR = {"kv": 0, "gate": 1}
_SHARED_GATE_UP = {"gate": 0, "up": 1}


class SglangWeightError(RuntimeError):
    """A released tensor that cannot be recovered from SGLang's parameters (names the tensor)."""


def _stored_shape(kind: str, shape: tuple[int, ...], is_scale: bool) -> tuple[int, ...]:
    """Shape of a released tensor (or its scale) as stored on disk."""
    if kind == "fp4":
        return formats.row_scale_shape(*shape) if is_scale else formats.packed_fp4_shape(*shape)
    if kind == "fp8":
        return formats.fp8_block_scale_shape(*shape) if is_scale else shape
    if kind == "fp8_rows":
        return formats.row_scale_shape(*shape) if is_scale else shape
    return shape


def _shard_rank(target: LoadTarget) -> int:
    if target.param.endswith("wkv_gate.weight"):
        return _SHARD_ORDER_COMPRESSOR[target.shard]
    if ".gate_up_proj." in target.param:
        return _SHARED_GATE_UP[target.shard]
    return _SHARD_ORDER[target.shard]


def released_tensors(params: Mapping[str, torch.Tensor], cfg: V41Config, names: Iterable[str],
                     dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Released `names` (weights, not scales) as float tensors recovered from SGLang's `params`.
    Tensors SGLang drops for text (`gate.bias_vl`, the vision-token routing bias) are left out."""
    specs = {s.name: s for s in checkpoint_tensor_specs(cfg)}
    wanted = [name for name in names if load_target(name, params) is not None]
    stored: dict[str, tuple[LoadTarget, tuple[int, ...]]] = {}  # disk name -> (target, disk shape)
    for name in wanted:
        spec = specs[name]
        pieces = [(name, False)]
        if spec.kind in ("fp8", "fp4", "fp8_rows"):
            pieces.append((scale_name(name), True))
        for disk_name, is_scale in pieces:
            target = load_target(disk_name, params)
            if target is None:
                raise SglangWeightError(f"{disk_name}: SGLang drops this tensor, but keeps {name}")
            stored[disk_name] = (target, _stored_shape(spec.kind, spec.shape, is_scale))
    # every disk tensor sharing a parameter (all of them, not just the wanted ones) fixes the offsets
    siblings: dict[tuple[str, int | None], list[tuple[int, str, int]]] = defaultdict(list)
    for spec in specs.values():
        pieces = [(spec.name, False)]
        if spec.kind in ("fp8", "fp4", "fp8_rows"):
            pieces.append((scale_name(spec.name), True))
        for disk_name, is_scale in pieces:
            try:
                target = load_target(disk_name, params)
            except KeyError:
                continue
            if target is None or target.shard in (None, "dequant_scale"):
                continue
            rows = _stored_shape(spec.kind, spec.shape, is_scale)[0]
            siblings[(target.param, target.expert)].append((_shard_rank(target), disk_name, rows))

    def raw(disk_name: str) -> torch.Tensor:
        target, shape = stored[disk_name]
        param = params[target.param].detach()
        if target.expert is not None:
            param = param[target.expert]
        if target.shard not in (None, "dequant_scale"):
            offset = 0
            for _, sibling, rows in sorted(siblings[(target.param, target.expert)]):
                if sibling == disk_name:
                    param = param[offset:offset + rows]
                    break
                offset += rows
        if tuple(param.shape) != tuple(shape):
            raise SglangWeightError(f"{disk_name}: SGLang's {target.param} gives {tuple(param.shape)}, "
                                    f"the released tensor is {tuple(shape)}")
        return param

    out: dict[str, torch.Tensor] = {}
    for name in wanted:
        spec = specs[name]
        weight = raw(name)
        if spec.kind in ("fp8", "fp4"):
            scale_target, _ = stored[scale_name(name)]
            if scale_target.shard == "dequant_scale":  # SGLang folded the scale in at load (wo_a)
                out[name] = weight.to(dtype)
                continue
            scale = raw(scale_name(name))
            if scale.dtype != torch.float8_e8m0fnu:
                scale = scale.float().to(torch.float8_e8m0fnu)  # powers of two: exact
            if spec.kind == "fp4":
                out[name] = formats.dequantize_fp4(weight.view(torch.int8), scale, dtype)
            else:
                out[name] = formats.dequantize_fp8(weight.view(torch.float8_e4m3fn), scale, dtype)
        else:
            out[name] = weight.to(dtype)
    return out


def rounded_by_sglang(name: str) -> bool:
    """Released fp32 tensors SGLang stores in bf16 (see module doc)."""
    return ".compressor.wkv." in name or ".compressor.wgate." in name or name == "head.weight"


def reference_model_from_sglang(sglang_model: torch.nn.Module, cfg: V41Config, checkpoint_dir: str,
                                cache_quant: str = "release", role: str = "full") -> V41Model:
    """The reference model of `role` ('full', or 'prefill' for SGLang's model truncated to the prefill
    role), its weights recovered layer by layer from SGLang's parameters (the compressors' from the
    checkpoint; the text-unused `gate.bias_vl` stays zero)."""
    params = dict(sglang_model.named_parameters(remove_duplicate=False))
    model = V41Model(cfg, role=role, cache_quant=cache_quant)
    by_layer: dict[str, list[str]] = defaultdict(list)
    for name in sorted(model.expected_tensor_names()):
        by_layer[name.split(".")[1] if name.startswith("layers.") else ""].append(name)
    for names in by_layer.values():  # one layer's float copy at a time
        exact = [n for n in names if rounded_by_sglang(n)]
        model.load_weights(released_tensors(params, cfg, [n for n in names if n not in exact]), strict=False)
        if exact:
            model.load_weights(load_weights(checkpoint_dir, exact, dtype=torch.float32, progress=False), strict=False)
    return model
