"""P's forward through SGLang's own model loop with the reference model's blocks as its layers (cpu_platform/
reference_layer.py, layer_loop.py) against the whole-forward reference (whole_forward.py), over two SGLang pools, in a
process of its own (SGLang's parallel state owns torch.distributed). Prints one line `REPORT <json>` with raw facts.

    python test/sglang_plugin/prefill_layer_checks.py CHECKPOINT_DIR FORWARD_LOG

SGLang's truncated asym-prefill model is built and loaded from the checkpoint by its own loader with the plugin's
hooks (P's cut bound), and set up by the CPU platform's `post_load_model`. Each case runs the same
ForwardBatches (P's prefix rows [0, B) of each prompt, in SGLang's chunks) twice: through ReferenceForward on one
pool, and through SGLang's causal-LM forward on a second; then every byte of both pools is compared. Layer L's KV
path runs SGLang's attention backend (`forward_low_ratio_sources`), the real DeepseekV4AttnBackend method on an
instance that holds only what that path reads (the pool; its metadata comes from the CPU platform's
`init_forward_metadata`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch

WINDOW = 128
FULL_TOKENS = 4096
PAGE = 256
# (name, [[(prompt N, [chunk ends of P's prefix])] per request], deterministic); B = N - W
CASES = (
    ("n129", [(129, [1])], False),
    ("n300", [(300, [172])], False),
    ("n1000_chunked", [(1000, [512, 872])], False),
    ("batch_129_300", [(129, [1]), (300, [172])], False),
    ("batch_300_1000_deterministic", [(300, [172]), (1000, [512, 872])], True),
)


class Batch:
    """The ForwardBatch fields SGLang's layer loop, its attention backend's low-ratio writes and the reference
    forward read, for an extend batch of several requests' rows."""

    def __init__(self, spans: list[tuple[int, int, int]], req_to_token: torch.Tensor) -> None:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

        self.forward_mode = ForwardMode.EXTEND
        self.batch_size = len(spans)
        self.req_pool_indices = torch.tensor([req for req, _, _ in spans], dtype=torch.int64)
        self.extend_seq_lens_cpu = [end - start for _, start, end in spans]
        self.extend_seq_lens = torch.tensor(self.extend_seq_lens_cpu, dtype=torch.int32)
        self.extend_start_loc = None
        self.positions = torch.cat([torch.arange(start, end) for _, start, end in spans])
        self.out_cache_loc = torch.cat([req_to_token[req, start:end].long() for req, start, end in spans])
        self.attn_cp_metadata = None
        self.encoder_swa_replay = False
        self.capture_hidden_mode = CaptureHiddenMode.NULL
        self.spec_info = None


def _difference(a: torch.Tensor, b: torch.Tensor) -> dict:
    """How two uint8 buffers differ: the differing bytes, and whether every differing 4-bit fp4 code is a zero
    whose sign bit alone differs (0x0 against 0x8: the same value)."""
    x = a ^ b
    zero_sign = torch.ones_like(x, dtype=torch.bool)
    for shift in (0, 4):
        code_a, code_x = (a >> shift) & 0x0F, (x >> shift) & 0x0F
        zero_sign &= (code_x == 0) | ((code_x == 0x08) & ((code_a & 0x07) == 0))
    return {"bytes": int((x != 0).sum()), "zero_sign_only": bool(zero_sign.all())}


def load_sglang_model(checkpoint: str, record) -> torch.nn.Module:
    """SGLang's DeepseekV4ForCausalLM built and loaded by SGLang's own loader as a CPU server's model runner does:
    the plugin's hooks loaded, the CPU patches applied, `record` published as the scheduler's ServerArgs (call
    inside sglang_on_cpu.sglang_cpu_context(record))."""
    from meta_model import cpu_adjustments
    from sglang.srt import runtime_context
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import loader
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import SpawnRanks

    from sglang_asym.sglang_plugin.cpu_platform.cpu_patch import SCHEDULER
    from sglang_asym.sglang_plugin.cpu_platform.patches import apply_cpu_patches

    load_plugins()
    apply_cpu_patches(SCHEDULER)
    runtime_context.publish(record, role="scheduler", ranks=SpawnRanks(world_rank=0))
    model_config, load_config = ModelConfig(checkpoint), LoadConfig()
    quant_config = loader._get_quantization_config(model_config, load_config)
    default_loader = loader.DefaultModelLoader(load_config)
    with set_default_torch_dtype(model_config.dtype), cpu_adjustments(), torch.device("cpu"):  # as load_model
        model = loader._initialize_model(model_config, load_config, quant_config)
    with cpu_adjustments():
        default_loader.load_weights_only(model, default_loader._get_all_weights(model_config, model),
                                         torch.device("cpu"))
    return model


def main(checkpoint: str, forward_log: str) -> None:
    os.environ["SGLANG_ASYM_FORWARD_LOG"] = forward_log
    sys.path.insert(0, os.path.dirname(__file__))
    from sglang_cpu_checks import _pool_tensors

    from sglang_asym.config import V41Config
    from sglang_asym.sglang_plugin.shared.settings import AsymSettings, attach
    from sglang_on_cpu import sglang_cpu_context

    from sglang.srt.server_args import ServerArgs

    cfg = V41Config.from_json_file(checkpoint)
    record = ServerArgs(model_path=checkpoint, device="cpu")  # as the CPU server's scheduler publishes it
    attach(record, AsymSettings("asym-prefill", window=WINDOW, semantics="asym-exact-encoder"))
    with sglang_cpu_context(record):
        from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
        from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context

        from sglang_asym.sglang_plugin.cpu_platform.reference_forward import RECORDS, RequestRecord
        from whole_forward import ReferenceForward
        from sglang_asym.sglang_plugin.cpu_platform.platform import AsymCpuPlatform
        from sglang_on_cpu import build_kv_pool
        from sglang_asym.sglang_plugin.shared.pool_rows import PoolRows

        model = load_sglang_model(checkpoint, record)
        AsymCpuPlatform().post_load_model(model)  # as the model runner calls it after loading
        loop = model.model.layers[0].forward_hc_pre_from_prev.loop

        def new_pool():
            pool = build_kv_pool(cfg, full_tokens=FULL_TOKENS, swa_tokens=FULL_TOKENS, max_reqs=4)
            pool.register_mapping(torch.arange(FULL_TOKENS + PAGE, dtype=torch.int64))
            return pool

        backend = DeepseekV4AttnBackend.__new__(DeepseekV4AttnBackend)
        backend.tail_source_kv_layer_id = None
        backend.low_ratios, backend.prefill_candidates = (1, 2), None  # no prefill graph on CPU
        set_forward_context(ForwardContext(attn_backend=backend))
        req_to_token = torch.zeros(4, 2048, dtype=torch.int32)
        for req in range(1, 4):
            req_to_token[req, :1024] = torch.arange(1024, dtype=torch.int32) + PAGE * (1 + 4 * (req - 1))
        RECORDS.req_to_token, RECORDS.role = req_to_token, "prefill"

        report = {"layer_forward": type(model.model.layers[0].forward_hc_pre_from_prev).__name__,
                  "loop_role": loop.model.role, "layers_substituted": [
            i for i, layer in enumerate(model.model.layers) if "forward_hc_pre_from_prev" in vars(layer)],
            "cases": {}}
        reference = loop.model
        for name, requests, deterministic in CASES:
            pools = {"reference": new_pool(), "sglang_loop": new_pool()}
            before = {k: v.clone() for k, v in _pool_tensors(pools["sglang_loop"]).items()}
            RECORDS.requests = {req: RequestRecord(n, 1000 + req) for req, (n, _) in enumerate(requests, start=1)}
            loop.setup = dataclasses.replace(loop.setup, deterministic=deterministic)
            # P's chunks, request by request: forward k holds every request's k-th chunk
            chunk_lists = [[0, *ends] for _, ends in requests]
            forwards = []
            for k in range(max(len(c) - 1 for c in chunk_lists)):
                forwards.append([(req, c[k], c[k + 1]) for req, c in enumerate(chunk_lists, start=1) if k + 1 < len(c)])
            tokens = torch.randint(0, cfg.vocab_size, (4, 1024), generator=torch.Generator().manual_seed(5))
            for path, pool in pools.items():
                RECORDS.kv_pool = pool
                loop.plan = None  # bind this pool (the model runner's one pool in a server)
                ref_forward = ReferenceForward(reference, PoolRows(pool, req_to_token, cfg), loop.setup.semantics,
                                               deterministic, loop.setup.split)
                for spans in forwards:
                    batch = Batch(spans, req_to_token)
                    input_ids = torch.cat([tokens[req, start:end] for req, start, end in spans])
                    if path == "reference":
                        ref_forward(input_ids, batch.positions, batch)
                    else:
                        backend.token_to_kv_pool = pool
                        backend.init_forward_metadata(batch)  # the CPU platform's (cpu_ops.py)
                        model.forward(input_ids, batch.positions, batch)
            ref, ours = _pool_tensors(pools["reference"]), _pool_tensors(pools["sglang_loop"])
            report["cases"][name] = {
                "differing": {k: _difference(ref[k], ours[k]) for k in sorted(ref) if not torch.equal(ref[k], ours[k])},
                "written": {path: sorted(k for k, t in _pool_tensors(pool).items() if not torch.equal(t, before[k]))
                            for path, pool in pools.items()},
                "forwards": len(forwards),
            }
        set_forward_context(None)
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
