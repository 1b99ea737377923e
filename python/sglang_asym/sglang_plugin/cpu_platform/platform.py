"""SGLang's own engine on a CPU machine: an out-of-tree SGLang platform (entry-point group
`sglang.srt.platforms`, name `sglang_asym`, as the plugin: `SGLANG_PLUGINS=sglang_asym` allows both).

SGLang 0.5.23 resolves its platform once per process (`sglang.srt.platforms.current_platform`): it
asks every installed platform plugin's `activate()`, and falls back to CUDA / the base platform
when none answers. `activate` answers on a machine without a CUDA device (or when
`SGLANG_PLATFORM=sglang_asym` names it): SGLang's scheduler, PD queues, Mooncake KV manager,
tokenizer manager, detokenizer and HTTP server then run on CPU, torch-native wherever the platform is
asked, with no Triton and no device graphs. Being out of tree is what keeps SGLang from reaching for
its CUDA fallback kernels (`vllm._custom_ops` in the rotary embedding, the sgl-kernel CPU ops of its
in-tree CPU engine). What the platform cannot decline through its own interface is patched in
`patches.py`. `post_load_model` sets up DeepSeek-V4.1's forward: SGLang's own model loop runs on every
server, the project's reference model computing each decoder layer over SGLang's pool: on an asym-prefill server
layers 0..L-1 inside P's cut (`reference_layer.py`), on every other server every layer, and the reference head
as the logits op (`layer_loop.py`). `--speculative-algorithm DSPARK` runs the platform's speculative worker
(dspark_worker.py) with torch slot-table helpers (spec_slots.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform

SPECULATIVE_ALGORITHM = "DSPARK"  # the one speculative algorithm the CPU engine serves (greedy requests)


class AsymCpuPlatform(CpuDeviceMixin, SRTPlatform):
    """CPU, out of tree: torch-native attention, no Triton, no graphs, no pinned memory."""

    _enum = PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    capabilities = PlatformCapabilities()  # no Triton, no device graphs, no HiCache kernels

    def is_pin_memory_available(self, device: Any = None) -> bool:
        return False

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return "torch_native"

    def get_group_coordinator_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    def get_dispatch_key_name(self) -> str:
        return "native"

    def apply_server_args_defaults(self, server_args: Any) -> None:
        from .server_defaults import apply_cpu_defaults

        apply_cpu_defaults(server_args)

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return algorithm.upper() == SPECULATIVE_ALGORITHM

    def get_speculative_worker_cls(self, algorithm: str) -> type | None:
        """DSPARK: the project's drafter over the reference layers (dspark_worker.py); SGLang's own
        workers for anything else (refused earlier by `supports_speculative_algorithm`)."""
        if algorithm.upper() != SPECULATIVE_ALGORITHM:
            return None
        from .dspark_worker import AsymDSparkWorker

        return AsymDSparkWorker

    def get_speculative_cache_locs_fn(self) -> Callable[..., torch.Tensor]:
        from .spec_slots import speculative_cache_locs

        return speculative_cache_locs

    def post_load_model(self, model: torch.nn.Module) -> None:
        from ..prefill.cut_hook import cut_of

        if cut_of(model) is not None:  # asym-prefill: SGLang's own loop with P's cut, reference layers inside
            from .reference_layer import install_prefill_reference_layers

            install_prefill_reference_layers(model)
            return
        from .layer_loop import install_full_layers

        install_full_layers(model)

