"""A process-wide SGLang context on a CPU machine, enough to construct SGLang's V4 model and pools.

SGLang's layers read the published ServerArgs (`runtime_context.publish`) and its model-parallel
groups even at TP 1, so `sglang_cpu_context()` installs the CPU import stand-ins, publishes a
ServerArgs record, and starts a world-size-1 gloo group on 127.0.0.1 with SGLang's parallel state.
It owns torch.distributed for the process: use it in a dedicated process (the inspect CLI does).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any, Iterator

from ..cpu_platform import import_gaps as cpu_import_gaps


def _free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def sglang_cpu_context(server_args: Any = None) -> Iterator[None]:
    """`server_args`: the record to publish (default `ServerArgs(model_path="dummy")`); give one
    with no `--device` for the reason below."""
    cpu_import_gaps.install()
    import torch.distributed as dist

    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    if dist.is_initialized():
        raise RuntimeError("sglang_cpu_context needs a process where torch.distributed is not initialised")
    reset_context()
    # No --device: the rope factory's CPU branch only knows deepseek_yarn scaling, and V4.1's
    # ratio-0 layers have none; the generic branch builds every layer.
    if server_args is None:
        server_args = ServerArgs(model_path="dummy")
    publish(server_args, role="test", ranks=SpawnRanks(world_rank=0))
    parallel_state.init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_local_port()}",
        backend="gloo",
    )
    try:
        parallel_state.initialize_model_parallel(backend="gloo")
        yield
    finally:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
        reset_context()


@contextlib.contextmanager
def patched(module: object, name: str, value: object) -> Iterator[None]:
    """Temporarily rebinds `module.name` (restored on exit, also on error)."""
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)
