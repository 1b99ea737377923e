"""The server-argument defaults of SGLang's engine on sglang-asym's CPU platform.

Applied through the platform's `apply_server_args_defaults` (SGLang records them as the platform's
declarations); a value the user gave on the command line is never replaced.
  disable_cuda_graph                       True: no device graphs on CPU
  disaggregation_decode_retraction_backup  cpu_tensor: the default host-pool backup sizes a HiCache
                                           pool from free RAM and needs more than 10 GiB of it
  max_total_tokens                         CPU_MAX_TOTAL_TOKENS: SGLang would otherwise size the pool
                                           from a fraction of the whole machine's RAM
  max_running_requests                     CPU_MAX_RUNNING: the V4 pool sizes its SWA rings by it
  mem_fraction_static                      CPU_MEM_FRACTION: SGLang keeps (1 - fraction) of the device's
                                           TOTAL memory free; on CPU that is the whole machine's RAM, so
                                           its default refuses to start a server on a busy machine
                                           (a 24 GB machine with 4 GB free leaves 0.2 GB for the pool)
  sleep_on_idle                            True: an idle scheduler would otherwise poll at full speed
                                           and hold a core (servers share a 2-core machine here)
  disable_radix_cache                      True: a cached prefix's decoder-layer window rows were
                                           computed under the request that wrote them (its replay
                                           floor), so a hit would not reproduce the reference model
and one environment default (an environment value the user set is kept):
  SGLANG_TIMEOUT_KEEP_ALIVE                HTTP_KEEP_ALIVE_S: the routers keep idle connections to a
                                           worker for 90 s (reqwest's pool default); a server that
                                           closes them after SGLang's 5 s races the router's next use
                                           of one, and the router answers 502 "error sending request"
                                           (seen once in CI between two requests about 5 s apart)
and, on an asym-prefill server only (`prefill_environment`, from the launcher once its role is known):
  TRITON_INTERPRET                         1: P's forward runs SGLang's own model loop (reference_layer.py),
                                           whose Triton kernels have CPU patches (cpu_ops.py); one that
                                           has none runs under Triton's CPU interpreter instead of failing
                                           without a GPU driver; the scheduler processes the launcher
                                           spawns import SGLang's kernels with it set
"""

from __future__ import annotations

import os
from typing import Any

CPU_MAX_TOTAL_TOKENS = 8192
CPU_MAX_RUNNING = 8
CPU_MEM_FRACTION = 0.98
HTTP_KEEP_ALIVE_S = 120  # above the routers' 90 s idle-connection pool: the router closes first


def apply_cpu_defaults(server_args: Any) -> None:
    server_args.disable_cuda_graph = True
    if server_args.disaggregation_decode_retraction_backup is None:
        server_args.disaggregation_decode_retraction_backup = "cpu_tensor"
    if server_args.max_total_tokens is None:
        server_args.max_total_tokens = CPU_MAX_TOTAL_TOKENS
    if server_args.max_running_requests is None:
        server_args.max_running_requests = CPU_MAX_RUNNING
    if server_args.mem_fraction_static is None:
        server_args.mem_fraction_static = CPU_MEM_FRACTION
    server_args.disable_radix_cache = True
    server_args.sleep_on_idle = True
    os.environ.setdefault("SGLANG_TIMEOUT_KEEP_ALIVE", str(HTTP_KEEP_ALIVE_S))


TRITON_INTERPRET_ENV = "TRITON_INTERPRET"


def prefill_environment(settings: Any) -> None:
    """The launcher of an asym-prefill server on the CPU engine, once its AsymSettings are attached: Triton's CPU
    interpreter for the scheduler processes it spawns (see above). Any other server is left alone."""
    from .engine_mode import cpu_engine_selected

    if settings is not None and settings.is_prefill and cpu_engine_selected():
        os.environ.setdefault(TRITON_INTERPRET_ENV, "1")
