"""Oracle script (runs in .venv-oracle): build NVIDIA nemo-automodel's DeepSeek-V4.1 from a config,
randomize it, export the released tensor names, and compute full-sequence logits.

Inputs (safetensors): `config_json` (uint8 bytes of our config.json), `seed` (int64 [1]),
`input_ids.<k>` (int64 [batch, seq], any number of them). Outputs: `w.<released name>` for every
tensor, and per input `logits_none.<k>` (cache quantization replaced by the identity) and
`logits_release.<k>` (as released)."""

import json
import sys

import torch
from safetensors.torch import load_file, save_file

import nemo_automodel.components.models.deepseek_v41.attention as attention_module
from nemo_automodel.components.models.common import BackendConfig
from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41Config
from nemo_automodel.components.models.deepseek_v41.model import DeepseekV41ForCausalLM

inputs = load_file(sys.argv[1])
raw = json.loads(bytes(inputs["config_json"].tolist()).decode())
seed = int(inputs["seed"][0])
text = dict(raw["text_config"])
text.pop("model_type", None)
text["dtype"] = "float32"
config = DeepseekV41Config(text_config=text, vision_config={"num_hidden_layers": 0})
torch.manual_seed(seed)
backend = BackendConfig(attn="eager", linear="torch", rms_norm="torch_fp32", experts="torch", dispatcher="torch")
model = DeepseekV41ForCausalLM(config, backend=backend)
model.initialize_weights(buffer_device=torch.device("cpu"), dtype=torch.float32)
model = model.float().eval()
gen = torch.Generator().manual_seed(seed + 1)
with torch.no_grad():
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("norm.weight"):
            tensor.copy_(1 + 0.1 * torch.randn(tensor.shape, generator=gen))
        elif name.endswith("sinks_param.weight") or name.endswith("e_score_correction_bias"):
            tensor.copy_(0.5 * torch.randn(tensor.shape, generator=gen))
        elif name.endswith("_hc.base"):
            tensor.copy_(0.3 * torch.randn(tensor.shape, generator=gen))
        elif name.endswith("_hc.scale"):
            tensor.copy_(1 + 0.2 * torch.randn(tensor.shape, generator=gen))
        elif name.endswith("_hc.fn"):
            tensor.copy_(0.05 * torch.randn(tensor.shape, generator=gen))
        elif name.endswith("compressor.wkv.weight") or name.endswith("compressor.wgate.weight"):
            tensor.copy_(0.08 * torch.randn(tensor.shape, generator=gen))
        elif name.endswith(".weight") and tensor.ndim == 2:
            tensor.copy_(0.06 * torch.randn(tensor.shape, generator=gen))
    # released experts are stacked in nemo; randomize them too
    for name, tensor in model.named_parameters():
        if name.endswith("gate_and_up_projs") or name.endswith("down_projs"):
            tensor.copy_(0.06 * torch.randn(tensor.shape, generator=gen))

out = {}
for key, value in model.state_dict_adapter.to_hf(model.state_dict()).items():
    out["w." + key] = value.detach().float().contiguous()
original = attention_module.quantize_cache
for key in sorted(k for k in inputs if k.startswith("input_ids.")):
    ids, tag = inputs[key].long(), key.split(".", 1)[1]
    with torch.no_grad():
        out[f"logits_release.{tag}"] = model(ids).logits.float().contiguous()
        attention_module.quantize_cache = lambda values, *, format, block_size: values
        try:
            out[f"logits_none.{tag}"] = model(ids).logits.float().contiguous()
        finally:
            attention_module.quantize_cache = original
save_file(out, sys.argv[2])
