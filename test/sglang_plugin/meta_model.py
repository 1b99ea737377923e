"""SGLang's own DeepseekV4ForCausalLM, built on a CPU machine: on the meta device, or on "cpu".

Used to read SGLang's parameter names and shapes for a V4.1 config, and to load checkpoints through
SGLang's own `load_weights` (the weight loader runs on CPU); nothing here can run a forward (the V4
KV-store and mHC kernels are Triton/CUDA only). With a `PrefillRole` the model is the prefill role's
truncation (prefill/model.py). Needs `sglang_cpu_context()` (sglang_on_cpu.py) around it. CPU-only adjustments, scoped
by `cpu_adjustments()`:
- the rope factory's device lookup (`rope_variant.get_device`) raises without an accelerator;
  it is answered "cpu";
- the Engram hasher is not built: it loads the real tokenizer to compress the vocabulary, and it
  holds no parameters;
- `load_weights` ends with a JIT prewarm of the CUDA mHC kernels (`_prewarm_mhc_kernels`); skipped.
The config goes through SGLang's `DeepseekV41Config` exactly as ModelConfig would, with
`topk_group = n_group` (ModelConfig forces it for V4: the V3 template's group limit is not used).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from sglang_asym.config import V41Config
from sglang_asym.sglang_plugin.prefill.model import install_prefill_loading, patched, truncated_construction
from sglang_asym.sglang_plugin.prefill.role import PrefillRole
from sglang_asym.tensor_specs import backbone_tensor_specs

# The released Flash config's `engram_vocab_size` (V41Config does not model it). Derived: SGLang
# draws each Engram layer's 3 x 8 hash-table primes upward from this size, and their sums are
# exactly the released table sizes 384006168 (layer 1) and 384016682 (layer 14).
FLASH_ENGRAM_VOCAB_SIZE = 16_000_000
# The released checkpoint's FP8 block (SGLang's V4.1 loader: "V4 128x128, V4.1 32x32").
V41_FP8_BLOCK = (32, 32)


@dataclass(frozen=True)
class ParamInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str


def sglang_hf_config(cfg: V41Config, **text_overrides: Any) -> Any:
    """SGLang's DeepseekV41Config for a V41Config (released nested layout, V4 ModelConfig fix-ups)."""
    raw = cfg.to_hf_dict()
    text = dict(raw["text_config"])
    if cfg.engram_layer_ids and "engram_vocab_size" not in text:
        if cfg.engram_num_embeddings != V41Config.flash().engram_num_embeddings:
            raise ValueError("config has Engram tables but no engram_vocab_size (SGLang derives the table "
                             "layout from it); only the Flash tables' value is known")
        text["engram_vocab_size"] = FLASH_ENGRAM_VOCAB_SIZE
    text.update(text_overrides)
    raw["text_config"] = text
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config

    hf = DeepseekV41Config(**raw)
    hf.topk_group = hf.n_group
    return hf


def release_quant_config() -> Any:
    """SGLang's quantization config for the released checkpoint: block FP8 (ue8m0 scales) for the
    dense projections, MXFP4 routed experts."""
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    quant = Fp8Config(
        is_checkpoint_fp8_serialized=True,
        weight_block_size=list(V41_FP8_BLOCK),
        scale_fmt="ue8m0",
    )
    # ModelLoader sets these from ModelConfig for a DeepSeek-V4 checkpoint with MXFP4 experts.
    quant.is_fp4_experts = True
    quant.is_dsv4_fp4_experts = True
    return quant


@contextlib.contextmanager
def cpu_adjustments() -> Iterator[None]:
    """The CPU-only adjustments for building and loading SGLang's V4 model (see module doc)."""
    import sglang.srt.layers.rotary_embedding.rope_variant as rope_variant
    import sglang.srt.models.deepseek_v4 as deepseek_v4

    class _NoEngramHasher:
        @staticmethod
        def from_config(*args: Any, **kwargs: Any) -> None:
            return None

    model_class = deepseek_v4.DeepseekV4ForCausalLM
    with patched(rope_variant, "get_device", lambda *a, **k: "cpu"), patched(
        deepseek_v4, "EngramHasher", _NoEngramHasher
    ), patched(model_class, "_prewarm_mhc_kernels", lambda self: None):
        yield


def build_model(cfg: V41Config, device: str = "meta", quantized: bool = True,
                role: PrefillRole | None = None) -> torch.nn.Module:
    """SGLang's DeepseekV4ForCausalLM for `cfg` on `device` ("meta" or "cpu"; inside
    sglang_cpu_context), truncated to the prefill role when `role` is given. Load it inside
    `cpu_adjustments()`."""
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM

    hf = sglang_hf_config(cfg)
    quant = release_quant_config() if quantized else None
    previous_dtype = torch.get_default_dtype()
    # ModelLoader builds under the checkpoint dtype; parameters that do not pin theirs follow it.
    torch.set_default_dtype(getattr(torch, cfg.dtype))
    try:
        with cpu_adjustments(), torch.device(device):
            if role is None:
                return DeepseekV4ForCausalLM(hf, quant)
            with truncated_construction(role):
                model = DeepseekV4ForCausalLM(hf, quant)
            return install_prefill_loading(model, role)
    finally:
        torch.set_default_dtype(previous_dtype)


def build_meta_model(cfg: V41Config, quantized: bool = True) -> torch.nn.Module:
    """SGLang's DeepseekV4ForCausalLM for `cfg` on the meta device (inside sglang_cpu_context)."""
    return build_model(cfg, "meta", quantized)


def released_tensor_names(cfg: V41Config) -> list[str]:
    """Backbone tensor names of the released checkpoint, with the `.scale` beside every quantized
    weight (fp8 blocks and fp4 experts)."""
    names: list[str] = []
    for spec in backbone_tensor_specs(cfg):
        names.append(spec.name)
        if spec.kind in ("fp8", "fp4"):
            names.append(spec.name.removesuffix(".weight") + ".scale")
    return names


def parameter_table(model: torch.nn.Module) -> list[ParamInfo]:
    return [
        ParamInfo(name, tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for name, p in model.named_parameters()
    ]
