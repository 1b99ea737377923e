"""P's forward on CPU through SGLang's own DeepSeek-V4.1 model loop, the reference model computing layers 0..L-1.

On the asym-prefill role the CPU platform's `post_load_model` calls `install_prefill_reference_layers`. SGLang's
causal LM forward then runs as SGLang runs it, with P's cut inside (prefill/cut_hook.py): the embedding,
`hc_broadcast`, `_forward_impl` and its non-CUDA layer loop over layers 0..L-1 and its epilogue, layer L's mHC
combine and its KV path `forward_low_ratio_sources` -> `_low_ratio_compress_torch` (the two kernels there without
a CPU build replaced op for op, cpu_ops.py), and the pipeline-stage exit before the head. Each of layers 0..L-1 is
the reference model's block over SGLang's pool (layer_loop.py, the same loop every other server runs over all its
layers), for prompt rows [0, B) of extend batches only.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .layer_loop import LayerLoop, LayerLoopError, substitute_layers
from .reference_forward import RECORDS, ForwardPlan

log = logging.getLogger(__name__)


class PrefillForward:
    """The causal LM's forward (SGLang's, with P's cut), then the pool-dump test aid for each request whose prefix
    it completed: after layer L's KV path, which P's cut runs after the loop."""

    def __init__(self, forward: Any, loop: LayerLoop) -> None:
        self.forward, self.loop = forward, loop

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, *args: Any,
                 **kwargs: Any) -> Any:
        out = self.forward(input_ids, positions, forward_batch, *args, **kwargs)
        if forward_batch.forward_mode.is_extend() and forward_batch.batch_size:
            self.loop.dump_completed(ForwardPlan.request_rows(input_ids, positions, forward_batch))
        return out


def install_prefill_reference_layers(causal_lm: torch.nn.Module) -> LayerLoop:
    """The CPU platform's model setup for an asym-prefill server: the prefill role's reference model from SGLang's
    loaded parameters (reference_forward.reference_setup), its blocks as SGLang's decoder layers 0..L-1 of the
    truncated prefill model (P's cut bound, prefill/cut_hook.py)."""
    from ..prefill.cut_hook import cut_of, set_room_lookup
    from .reference_forward import reference_setup

    setup = reference_setup(causal_lm)
    if setup is None or cut_of(causal_lm) is None or setup.model.role != "prefill":
        raise LayerLoopError(f"{type(causal_lm).__name__} is not SGLang's DeepSeek-V4 asym-prefill model with P's "
                             "cut bound")
    loop = LayerLoop(setup, setup.model.plan.last_kv_source - 1)
    substitute_layers(causal_lm.model, loop)
    set_room_lookup(causal_lm, RECORDS.room)
    causal_lm.forward = PrefillForward(causal_lm.forward, loop)
    log.info("sglang-asym: DeepSeek-V4.1 asym-prefill runs SGLang's model loop with P's cut on CPU, the reference "
             "model's block as each of layers 0..%d (%s%s, %s caches)", loop.last_layer, setup.semantics.value,
             ", deterministic" if setup.deterministic else "", setup.model.quant.mode)
    return loop
