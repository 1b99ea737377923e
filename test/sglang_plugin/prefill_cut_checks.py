"""P's cut (prefill_cut_hook.py) driven through SGLang's own DeepseekV4ForCausalLM.forward on CPU, in a fresh
process (SGLang's parallel state owns torch.distributed). Prints one line `REPORT <json>` with raw facts.

    TRITON_INTERPRET=1 python test/sglang_plugin/prefill_cut_checks.py ROWS FORWARD_LOG

SGLang's truncated prefill model for the 40-layer small config is built on CPU with its own constructor
(prefill_model.py) and the cut installed as the `_initialize_model` hook installs it. What runs is SGLang's:
the causal LM's forward, `DeepseekV4Model._forward_impl` (embedding, `hc_broadcast`), its non-CUDA layer loop
`_forward_layers_hc_pre_from_prev` and the loop's epilogue, the mHC combine of layer L's input
(`deepseek_v4_mhc.combine` -> SGLang's Triton `mhc_combine`, under Triton's CPU interpreter), and the pipeline
stage exit. Two things are stand-ins, because SGLang has no CPU build of them: each decoder layer's
`forward_hc_pre_from_prev` (its mix statistics are TileLang, rope and the MoE clamp JIT-CUDA) records its
call and returns a known mHC state, and the attention backend records `forward_low_ratio_sources`.
"""

from __future__ import annotations

import json
import sys

import torch


def main(rows: int, forward_log: str) -> None:
    import os

    os.environ["SGLANG_ASYM_FORWARD_LOG"] = forward_log
    from meta_model import build_model
    from sglang_asym.sglang_plugin.prefill.cut_hook import cut_of, install_prefill_cut
    from sglang_asym.sglang_plugin.prefill.role import PrefillRole
    from sglang_on_cpu import sglang_cpu_context
    from harness.sglang_shapes import sglang_small

    cfg = sglang_small()
    role = PrefillRole.from_config(cfg)
    last = role.last_kv_source
    with sglang_cpu_context():
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context
        from sglang.srt.models import deepseek_v4_mhc as mhc

        torch.manual_seed(0)
        model = build_model(cfg, "cpu", quantized=False, role=role)
        install_prefill_cut(model, role)
        inner = model.model
        layers_run: list[int] = []
        states: dict[int, mhc.HcState] = {}

        def stand_in(i: int):
            def forward_hc_pre_from_prev(*, positions, state, input_ids, forward_batch, input_ids_global):
                layers_run.append(i)
                residual = state.residual + torch.randn_like(state.residual)
                pre = torch.softmax(torch.randn(residual.shape[0], residual.shape[1]), dim=-1)
                states[i] = mhc.HcState(residual, pre)
                return states[i]
            return forward_hc_pre_from_prev

        for i in range(last):
            inner.layers[i].forward_hc_pre_from_prev = stand_in(i)

        kv_calls: list[dict] = []

        class RecordingBackend:
            tail_forward_metadata = None

            def forward_low_ratio_sources(self, **kwargs):
                kv_calls.append(kwargs)

        heads: list[str] = []
        class HeadRecorder(torch.nn.Module):
            def forward(self, *args, **kwargs):
                heads.append("logits_processor")

        model.logits_processor = HeadRecorder()
        set_forward_context(ForwardContext(attn_backend=RecordingBackend()))
        batch = type("Batch", (), dict(forward_mode=ForwardMode.EXTEND, batch_size=1, extend_seq_lens_cpu=[rows],
                                       attn_cp_metadata=None, encoder_swa_replay=False))()
        positions = torch.arange(rows) + 1000  # absolute positions of a later chunk
        out = model.forward(torch.arange(rows) % cfg.vocab_size, positions, batch)

        final = states[last - 1]
        source = inner.layers[last]
        x_flat = final.residual.float()
        mixed = sum(final.pre[:, k, None].float() * x_flat[:, k] for k in range(final.residual.shape[1]))
        with torch.no_grad():
            expected = source.attn_hc.norm(mixed.to(final.residual.dtype))
        call = kv_calls[0] if kv_calls else {}
        report = {
            "cut_bound": cut_of(model) is role,
            "layers_run": layers_run,
            "end_layer_after": inner.end_layer,
            "kv_calls": len(kv_calls),
            "kv_layer_id": int(call["layer"].layer_id) if call else None,
            "kv_layer_is_source_attn": call.get("layer") is source.self_attn,
            "kv_q_lora": repr(call.get("q_lora")),
            "kv_run_indexer": call.get("run_indexer"),
            "kv_positions": call["positions"].tolist() == positions.tolist() if call else None,
            "kv_batch_is_ours": call.get("forward_batch") is batch,
            "kv_x_shape": list(call["x"].shape) if call else None,
            # the kernel rounds its fp32 sum to bf16 before the norm as this does; the norm's bf16 output may differ
            # from this one's by its last bit
            "kv_x_max_abs_diff": float((call["x"].float() - expected.float()).abs().max()) if call else None,
            "kv_x_max_abs": float(expected.float().abs().max()),
            "heads": heads,
            "lm_head": type(model.lm_head).__name__,
            "logits_shape": list(out.next_token_logits.shape),
            "logits_all_zero": bool((out.next_token_logits == 0).all()),
            "pp_group_restored": type(model.pp_group).__name__ != "NonLastStage"
                                 and type(inner.pp_group).__name__ != "NonLastStage",
        }
        set_forward_context(None)
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
