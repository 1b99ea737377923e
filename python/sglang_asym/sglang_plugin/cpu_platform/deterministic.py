"""SGLang's `--enable-deterministic-inference` on the CPU engine: a request's tokens do not depend on the load.

On a GPU SGLang gets batch invariance from its kernels (a deterministic attention backend, Triton
batch-invariant matmuls) and aligns chunked prefills to the attention backend's split tiles. On this
platform the forward is the project's reference model, so the flag means instead:
- each reference layer runs every (request, piece) of a batch as a pass of its own, so nothing
  another request adds to a batch changes a request's sums (`reference_forward.py`), and the rows of a
  speculative verify batch (DSpark, dspark_worker.py) one row per forward, so speculation does not change
  a greedy request's tokens;
- a prompt is chunked only at multiples of `--chunked-prefill-size`: the scheduler's
  `truncation_align_size` (SGLang's own deterministic-chunking knob) is set to the chunk size, so a
  request that does not get a whole chunk beside the others waits for the next batch instead of taking
  a load-dependent piece;
- asym-decode's window steps use the budget policy's deterministic mode (whole chunks on the grid from B
  or nothing, `sched.plan`).
SGLang's own handling of the flag is kept everywhere else (pytorch sampling backend, no radix cache);
three places would refuse or crash on CPU and are changed here, on this platform only:
  launcher   choices.DETERMINISTIC_ATTENTION_BACKEND_CHOICES  + "dsv4"  SGLang refuses the flag for every
             attention backend outside its list, and V4.1's override pins `dsv4`; the list is SGLang's
             extension point for this (add_deterministic_attention_backend_choices)
  scheduler  ModelRunner.maybe_enable_batch_invariant_mode    REPLACE  SGLang's Triton batch-invariant aten
             kernels register for CUDA / XPU / NPU and raise without an accelerator; here it checks that
             the installed reference layers run batch-invariant instead
  scheduler  Scheduler.init_deterministic_inference_config    AFTER    truncation_align_size =
             chunked_prefill_size (SGLang aligns only for flashinfer's split tiles)
"""

from __future__ import annotations

import logging
from typing import Any

from .cpu_patch import LAUNCHER, CpuPatch

log = logging.getLogger(__name__)

CPU_DETERMINISTIC_BACKEND = "dsv4"  # what SGLang's DeepSeek-V4 override pins as attention backend


def deterministic_inference() -> bool:
    """Whether this SGLang process serves with --enable-deterministic-inference (SGLang's own record)."""
    from sglang.srt.runtime_context import get_exec

    return bool(get_exec().deterministic.enable_deterministic_inference)


def allow_deterministic_backend() -> None:
    """Launcher: lets SGLang's flag validation accept V4.1's attention backend on this platform. Idempotent."""
    from sglang.srt.arg_groups.choices import (DETERMINISTIC_ATTENTION_BACKEND_CHOICES,
                                               add_deterministic_attention_backend_choices)

    if CPU_DETERMINISTIC_BACKEND not in DETERMINISTIC_ATTENTION_BACKEND_CHOICES:
        add_deterministic_attention_backend_choices([CPU_DETERMINISTIC_BACKEND])


def check_batch_invariant_forward(model_runner: Any) -> None:
    """Replaces ModelRunner.maybe_enable_batch_invariant_mode: the reference layers are the batch-invariant
    part here (layer_loop.py); a model they do not compute cannot be made batch-invariant on CPU."""
    from .layer_loop import layer_loop_of

    if not deterministic_inference():
        return
    if getattr(model_runner, "is_draft_worker", False):
        raise ValueError("--enable-deterministic-inference on sglang-asym's CPU engine: speculative decoding is "
                         "not supported")
    loop = layer_loop_of(model_runner.model)
    if loop is None or not loop.setup.deterministic:
        raise ValueError("--enable-deterministic-inference on sglang-asym's CPU engine needs the DeepSeek-V4.1 "
                         f"reference layers; {type(model_runner.model).__name__} does not run them")
    log.info("sglang-asym: deterministic inference: each request runs its own forwards, prefills chunk at "
             "fixed multiples of --chunked-prefill-size")


def align_prefill_chunks(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """After Scheduler.init_deterministic_inference_config: a chunked prompt is cut only at multiples of the
    chunk size, whatever else shares the prefill batch."""
    chunk = getattr(scheduler, "chunked_prefill_size", None)
    if deterministic_inference() and chunk is not None and chunk > 0:
        scheduler.truncation_align_size = chunk


DETERMINISTIC_PATCHES: tuple[CpuPatch, ...] = (
    CpuPatch("sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode", "REPLACE",
             check_batch_invariant_forward, "Triton batch-invariant kernels need an accelerator"),
    CpuPatch("sglang.srt.managers.scheduler.Scheduler.init_deterministic_inference_config", "AFTER",
             align_prefill_chunks, "prefill chunks at fixed multiples of the chunk size"),
)


def deterministic_patches(process: str) -> list[CpuPatch]:
    """The hooks of `process` (registered and applied with the CPU patches); the launcher's list change
    happens here and now."""
    if process == LAUNCHER:
        allow_deterministic_backend()
    return [p for p in DETERMINISTIC_PATCHES if p.process == process]

