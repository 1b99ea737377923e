"""The full model's forward through SGLang's own model loop with the reference model's blocks as its layers and its
head as the logits op (cpu_platform/layer_loop.py) against the whole-forward reference (reference_forward.py), over
two SGLang pools, in a process of its own. Prints one line `REPORT <json>` with raw facts.

    python test/sglang_plugin/full_layer_checks.py CHECKPOINT_DIR

SGLang's DeepseekV4ForCausalLM is built and loaded from the checkpoint by its own loader. Each case runs the same
sequence of ForwardBatches (prompt extends, decode steps, a speculative verify, a decode step with window rows
riding along, a forward capturing the drafter's features) twice: through ReferenceForward on one pool, through
SGLang's causal-LM forward on a second; it reports whether each forward's logits (and features) are equal, and the
pool buffers that differ.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder: the extend batch of P's check
from prefill_layer_checks import Batch as ExtendBatch, load_sglang_model  # noqa: E402

WINDOW = 128
CHUNK = 48
FULL_TOKENS = 4096
PAGE = 256
DRAFTS = 3


class Batch(ExtendBatch):
    """The ForwardBatch fields SGLang's causal LM forward (on CPU) and the reference forward read, for an extend,
    decode or verify batch of several requests' rows."""

    def __init__(self, mode: str, spans: list[tuple[int, int, int]], tokens: torch.Tensor,
                 req_to_token: torch.Tensor, capture: bool = False) -> None:
        from types import SimpleNamespace

        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

        super().__init__(spans, req_to_token)
        self.forward_mode = {"extend": ForwardMode.EXTEND, "decode": ForwardMode.DECODE,
                             "verify": ForwardMode.TARGET_VERIFY}[mode]
        self.input_ids = torch.cat([tokens[req, start:end] for req, start, end in spans])
        self.capture_hidden_mode = CaptureHiddenMode.FULL if capture else CaptureHiddenMode.NULL
        self.spec_info = SimpleNamespace(draft_token_num=DRAFTS + 1) if mode == "verify" else None
        self.return_logprob = False
        self.mm_inputs = None


# (name, deterministic, steps): a step is (mode, [(req, start, end)], capture) or ("ride", decode spans, rider spans)
CASES = (
    ("prompts_then_decode", False, [
        ("extend", [(1, 0, 300), (2, 0, 100)], False),
        ("decode", [(1, 300, 301), (2, 100, 101)], False),
        ("decode", [(1, 301, 302), (2, 101, 102)], False),
    ]),
    ("chunked_prompt_deterministic", True, [
        ("extend", [(1, 0, 200)], False),
        ("extend", [(1, 200, 400), (2, 0, 60)], False),
        ("decode", [(1, 400, 401), (2, 60, 61)], False),
    ]),
    ("verify_and_capture", False, [
        ("extend", [(1, 0, 250)], True),
        ("verify", [(1, 250, 250 + DRAFTS + 1)], True),
    ]),
    ("verify_deterministic", True, [
        ("extend", [(1, 0, 250), (2, 0, 90)], False),
        ("verify", [(1, 250, 250 + DRAFTS + 1), (2, 90, 90 + DRAFTS + 1)], False),
    ]),
    ("window_rides_in_decode", False, [
        ("extend", [(1, 0, 140)], False),
        ("extend", [(2, 0, 172)], False),  # a prefix [0, B) of a prompt of N = 300 (floors from B on)
        ("ride", [(1, 140, 141)], [(2, 172, 220)]),
        ("ride", [(1, 141, 142)], [(2, 220, 268)]),
        ("decode", [(1, 142, 143)], False),
    ]),
)
PROMPTS = {("window_rides_in_decode", 2): 300}


def main(checkpoint: str) -> None:
    sys.path.insert(0, os.path.dirname(__file__))
    from sglang_cpu_checks import _pool_tensors

    from sglang_asym.config import V41Config
    from sglang_asym.sglang_plugin.shared.settings import AsymSettings, attach
    from sglang_on_cpu import sglang_cpu_context

    from sglang.srt.server_args import ServerArgs

    cfg = V41Config.from_json_file(checkpoint)
    record = ServerArgs(model_path=checkpoint, device="cpu")
    attach(record, AsymSettings("asym-decode", window=WINDOW, window_chunk=CHUNK))
    with sglang_cpu_context(record):
        from sglang_asym.sglang_plugin.cpu_platform.layer_loop import install_full_layers
        from sglang_asym.sglang_plugin.cpu_platform.reference_forward import RECORDS, RequestRecord, ride_next_decode
        from whole_forward import ReferenceForward
        from sglang_asym.sglang_plugin.shared.pool_rows import PoolRows
        from sglang_on_cpu import build_kv_pool

        model = load_sglang_model(checkpoint, record)
        loop = install_full_layers(model)
        setup = loop.setup
        from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
        from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context

        backend = DeepseekV4AttnBackend.__new__(DeepseekV4AttnBackend)  # no layer reaches it: every one substituted
        backend.tail_source_kv_layer_id = None
        set_forward_context(ForwardContext(attn_backend=backend))

        def new_pool():
            pool = build_kv_pool(cfg, full_tokens=FULL_TOKENS, swa_tokens=FULL_TOKENS, max_reqs=4)
            pool.register_mapping(torch.arange(FULL_TOKENS + PAGE, dtype=torch.int64))
            return pool

        req_to_token = torch.zeros(4, 2048, dtype=torch.int32)
        for req in range(1, 4):
            req_to_token[req, :1024] = torch.arange(1024, dtype=torch.int32) + PAGE * (1 + 4 * (req - 1))
        RECORDS.req_to_token, RECORDS.role = req_to_token, "decode"
        report = {"semantics": setup.semantics.value, "replay": setup.replay.label, "cases": {}}
        tokens = torch.randint(0, cfg.vocab_size, (4, 1024), generator=torch.Generator().manual_seed(5))
        for name, deterministic, steps in CASES:
            pools = {"reference": new_pool(), "sglang_loop": new_pool()}
            ends: dict[int, int] = {}
            for step in steps:
                if step[0] == "extend":
                    for req, _, end in step[1]:
                        ends[req] = max(ends.get(req, 0), end)
            prompts = {req: PROMPTS.get((name, req), end) for req, end in ends.items()}
            outputs: dict[str, list] = {}
            for path, pool in pools.items():
                RECORDS.kv_pool = pool
                RECORDS.requests = {req: RequestRecord(n, 1000 + req) for req, n in prompts.items()}
                RECORDS.riders = []
                rows = PoolRows(pool, req_to_token, cfg)
                reference = ReferenceForward(setup.model, rows, setup.semantics, deterministic, setup.split,
                                             setup.replay)
                loop.plan = None  # bind this pool
                loop.setup = dataclasses.replace(loop.setup, deterministic=deterministic)
                forward = reference if path == "reference" else model.forward
                results = []
                for step in steps:
                    ridden = []
                    if step[0] == "ride":
                        rider = Batch("extend", step[2], tokens, req_to_token)
                        ride_next_decode(rider, ridden.append)
                        batch = Batch("decode", step[1], tokens, req_to_token)
                    else:
                        batch = Batch(step[0], step[1], tokens, req_to_token, capture=step[2])
                    out = forward(batch.input_ids, batch.positions, batch)
                    results.append({"logits": out.next_token_logits.clone(), "hidden": out.hidden_states,
                                    "ridden": [t.clone() for t in ridden]})
                outputs[path] = results
            ref, ours = _pool_tensors(pools["reference"]), _pool_tensors(pools["sglang_loop"])
            steps_report = []
            for a, b in zip(outputs["reference"], outputs["sglang_loop"]):
                steps_report.append({
                    "logits_equal": torch.equal(a["logits"], b["logits"]),
                    "logits_max_diff": float((a["logits"] - b["logits"]).abs().max()) if a["logits"].numel() else 0.0,
                    "rows": list(a["logits"].shape),
                    "hidden_shape": None if b["hidden"] is None else list(b["hidden"].shape),
                    "hidden_equal": (a["hidden"] is None and b["hidden"] is None) or (
                        a["hidden"] is not None and b["hidden"] is not None and torch.equal(a["hidden"], b["hidden"])),
                    "ridden_equal": len(a["ridden"]) == len(b["ridden"]) and all(
                        torch.equal(x, y) for x, y in zip(a["ridden"], b["ridden"])),
                    "ridden": len(a["ridden"])})
            report["cases"][name] = {"steps": steps_report,
                                     "differing": sorted(k for k in ref if not torch.equal(ref[k], ours[k]))}
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
