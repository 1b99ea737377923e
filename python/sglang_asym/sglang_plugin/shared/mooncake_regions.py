"""Mooncake memory registrations of an asymmetric server's scheduler, counted on SGLang's /metrics.

SGLang registers its pools with the Mooncake Transfer Engine through four methods of its
MooncakeTransferEngine wrapper and keeps no count. Hooks around them (hooks.py, scheduler processes of
asymmetric servers) count every region registered and deregistered successfully:
  sglang_asym:mooncake_regions_registered_total     regions registered (single or batched)
  sglang_asym:mooncake_regions_deregistered_total   regions deregistered
Their difference is what the engine holds now. A leak check (benchmark/soak_sglang_engine.py, the
asymmetric system tests) reads it before and after a run.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

REGISTERED = "sglang_asym:mooncake_regions_registered"
DEREGISTERED = "sglang_asym:mooncake_regions_deregistered"


@functools.lru_cache(maxsize=None)
def _counter(name: str) -> Any:
    from prometheus_client import Counter

    verb = "registered with" if name == REGISTERED else "deregistered from"
    return Counter(name, f"Memory regions this scheduler {verb} the Mooncake Transfer Engine.", ("model_name",))


def _count(name: str, regions: int) -> None:
    from sglang.srt.runtime_context import get_server_args

    if regions > 0:
        _counter(name).labels(model_name=get_server_args().served_model_name).inc(regions)


def around_register(original: Callable, engine: Any, ptr: int, length: int, *args: Any, **kwargs: Any) -> Any:
    result = original(engine, ptr, length, *args, **kwargs)  # raises when the engine refuses the region
    _count(REGISTERED, 1)
    return result


def around_deregister(original: Callable, engine: Any, ptr: int, *args: Any, **kwargs: Any) -> Any:
    result = original(engine, ptr, *args, **kwargs)
    _count(DEREGISTERED, 1)
    return result


def around_batch_register(original: Callable, engine: Any, ptrs: Sequence[int], lengths: Sequence[int],
                          *args: Any, **kwargs: Any) -> Any:
    result = original(engine, ptrs, lengths, *args, **kwargs)
    if result == 0:  # SGLang's wrapper answers a failed batch with a nonzero code
        _count(REGISTERED, len(ptrs))
    return result


def around_batch_deregister(original: Callable, engine: Any, ptrs: Sequence[int], *args: Any, **kwargs: Any) -> Any:
    result = original(engine, ptrs, *args, **kwargs)
    if result == 0:
        _count(DEREGISTERED, len(ptrs))
    return result
