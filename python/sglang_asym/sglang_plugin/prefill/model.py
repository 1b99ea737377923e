"""SGLang's own DeepseekV4ForCausalLM, truncated to the prefill role, and its filtered weight loading.

An asym-prefill server computes tokens [0, N-W) through the encoder layers and, of the last KV source
L (20 in Flash), only the path that writes its compressed rows and index keys. So it builds:
- the embeddings and layers 0..L-1 exactly as SGLang builds them;
- layer L through SGLang's own constructor, its MoE built on the meta device (never allocated), then
  stripped to `PrefillRole.kv_path_params`: input norm, compressor, indexer key projection;
- no module for layers L+1.. (SGLang's pipeline-parallel stand-in `PPMissingLayer`), no final norm and
  no LM head. The model's layer range becomes [0, L+1), as a pipeline stage's would.

Loading goes through SGLang's `load_weights` unchanged, behind a filter on checkpoint names
(`PrefillRole.admits`): tensors outside the role are skipped before SGLang sees them (so layer L's
`wq_a`/`wkv` never reach the fused `wqkv_a` bucket), and a checkpoint that lacks a tensor the role
needs is refused with the missing names. `post_load_weights` runs over the encoder layers only:
SGLang's per-layer refresh (attention-sink cache, mHC norm cache) reads parts layer L no longer has.

`truncated_construction` is entered around SGLang's model constructor (by the `_initialize_model`
hook on a server, directly in tests); `install_prefill_loading` then binds the two wrappers to the
instance. Everything SGLang-specific is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch

from .role import PrefillRole

log = logging.getLogger(__name__)

ROLE_ATTR = "_sglang_asym_prefill_role"
STATS_ATTR = "_sglang_asym_prefill_load_stats"


class PrefillModelError(RuntimeError):
    """The model or checkpoint cannot serve the prefill role (names what is wrong)."""


@dataclass(frozen=True)
class PrefillLoadStats:
    """What the prefill role's filter did during one `load_weights` call."""

    passed: frozenset[str]  # checkpoint names handed to SGLang's loader
    skipped: int  # checkpoint tensors outside the role


def role_of(model: Any) -> PrefillRole | None:
    return getattr(model, ROLE_ATTR, None)


@contextlib.contextmanager
def patched(module: object, name: str, value: object) -> Iterator[None]:
    """Temporarily rebinds `module.name` (restored on exit, also on error)."""
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def _no_lm_head(*args: Any, **kwargs: Any) -> torch.nn.Module:
    from sglang.srt.layers.utils import PPMissingLayer

    return PPMissingLayer()


@contextlib.contextmanager
def _moe_on_meta() -> Iterator[None]:
    """Builds V4's MoE on the meta device: the stripped layer drops it, so it is never allocated."""
    import sglang.srt.models.deepseek_v2 as deepseek_v2

    moe_class = deepseek_v2.DeepseekV2MoE

    def build_on_meta(*args: Any, **kwargs: Any) -> torch.nn.Module:
        with torch.device("meta"):
            return moe_class(*args, **kwargs)

    with patched(deepseek_v2, "DeepseekV2MoE", build_on_meta):
        yield


def strip_to_kv_path(layer: torch.nn.Module, role: PrefillRole) -> None:
    """Removes every parameter of the last KV source's layer that is not on its KV path, and every
    submodule left without parameters by that (param-free helpers such as rotary tables stay)."""
    keep = role.kv_path_params
    names = {name for name, _ in layer.named_parameters()}
    if not keep <= names:
        raise PrefillModelError(f"SGLang's layer {role.last_kv_source} lacks the KV-path parameters "
                                f"{sorted(keep - names)}: the pinned SGLang changed")
    keep_modules = {""} | {name.rsplit(".", 1)[0] if "." in name else "" for name in keep}
    keep_modules |= {path[:i] for path in list(keep_modules) for i in range(len(path)) if path[i] == "."}
    with_params = [path for path, module in layer.named_modules() if path and any(True for _ in module.parameters())]
    dropped: list[str] = []
    for path in with_params:  # parents come before children: a dropped parent takes its subtree along
        if path in keep_modules or any(path.startswith(d + ".") for d in dropped):
            continue
        parent_path, _, child = path.rpartition(".")
        (layer.get_submodule(parent_path) if parent_path else layer)._modules[child] = None
        dropped.append(path)
    for path in keep_modules:
        module = layer.get_submodule(path) if path else layer
        for pname, param in list(module._parameters.items()):
            full = f"{path}.{pname}" if path else pname
            if param is not None and full not in keep:
                module._parameters[pname] = None
    attn = layer.self_attn
    attn.use_mega_attention = False  # the mega-attention set-up rewrites wq_b / wo_a, which are gone
    if getattr(layer, "hc_pre_from_prev_sublayer", False):
        layer.ffn_hc = None
        layer.attn_hc = layer.attn_hc._replace(fn=None, scale=None, base=None)  # combine() reads cfg + norm


@contextlib.contextmanager
def truncated_construction(role: PrefillRole) -> Iterator[None]:
    """Around `DeepseekV4ForCausalLM(config, quant_config)`: builds the prefill role's truncation."""
    import sglang.srt.models.deepseek_v4 as dsv4
    from sglang.srt.layers.utils import PPMissingLayer

    make_pp_layers = dsv4.make_pp_layers
    last = role.last_kv_source

    def role_layers(num_hidden_layers: int, layer_fn: Any, *args: Any, **kwargs: Any):
        if num_hidden_layers != role.num_layers:
            raise PrefillModelError(f"the model has {num_hidden_layers} layers, the prefill role was "
                                    f"derived for {role.num_layers}")

        def role_layer(idx: int, prefix: str) -> torch.nn.Module:
            if idx < last:
                return layer_fn(idx=idx, prefix=prefix)
            if idx > last:
                return PPMissingLayer()
            with _moe_on_meta():
                layer = layer_fn(idx=idx, prefix=prefix)
            strip_to_kv_path(layer, role)
            return layer

        layers, start, end = make_pp_layers(num_hidden_layers, role_layer, *args, **kwargs)
        if (start, end) != (0, num_hidden_layers):
            raise PrefillModelError("the asym-prefill role does not run under pipeline parallelism "
                                    f"(this rank's stage is layers [{start}, {end}))")
        return layers, 0, last + 1

    with patched(dsv4, "make_pp_layers", role_layers), patched(dsv4, "ParallelLMHead", _no_lm_head):
        yield


def install_prefill_loading(model: Any, role: PrefillRole) -> Any:
    """Finishes a model built under `truncated_construction`: drops the final norm, marks the role,
    and binds the filtered `load_weights` / encoder-only `post_load_weights` to the instance."""
    from sglang.srt.layers.utils import PPMissingLayer

    if model.model.end_layer != role.last_kv_source + 1:
        raise PrefillModelError("install_prefill_loading needs a model built under truncated_construction")
    model.model.norm = PPMissingLayer()
    model.start_layer, model.end_layer = model.model.start_layer, model.model.end_layer
    setattr(model, ROLE_ATTR, role)
    sglang_load_weights = model.load_weights
    sglang_post_load_weights = model.post_load_weights

    def load_weights(weights: Iterable[tuple[str, torch.Tensor]], is_nextn: bool = False) -> None:
        if is_nextn:
            raise PrefillModelError("the asym-prefill role has no draft (nextn) layers to load")
        passed: set[str] = set()
        skipped = 0

        def role_weights() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal skipped
            for name, tensor in weights:
                if role.admits(name):
                    passed.add(name)
                    yield name, tensor
                else:
                    skipped += 1

        sglang_load_weights(role_weights(), is_nextn=False)
        missing = role.checkpoint_names - passed
        if missing:
            raise PrefillModelError(f"the checkpoint lacks {len(missing)} tensors the prefill role needs, "
                                    f"e.g. {sorted(missing)[:5]}")
        setattr(model, STATS_ATTR, PrefillLoadStats(frozenset(passed), skipped))
        log.info("asym-prefill: loaded %d checkpoint tensors, skipped %d outside the role", len(passed), skipped)

    def post_load_weights(is_nextn: bool = False, weight_names: Any = None) -> None:
        inner = model.model
        end = inner.end_layer
        inner.end_layer = role.last_kv_source  # SGLang's per-layer refresh runs over whole layers only
        try:
            sglang_post_load_weights(is_nextn=is_nextn, weight_names=weight_names)
        finally:
            inner.end_layer = end

    model.load_weights = load_weights
    model.post_load_weights = post_load_weights
    return model
