"""The Mooncake registration counters (sglang_plugin/shared/mooncake_regions.py) around SGLang's four calls: a region
counts once it is registered or deregistered, a failed batch (nonzero code) or a raising call counts nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from sglang_asym.sglang_plugin.shared import mooncake_regions as regions

MODEL = "regions-test-model"


@pytest.fixture(autouse=True)
def server_args(monkeypatch):
    import sglang.srt.runtime_context as runtime_context

    monkeypatch.setattr(runtime_context, "get_server_args", lambda: SimpleNamespace(served_model_name=MODEL))


def _held() -> tuple[float, float]:
    def value(name: str) -> float:
        return REGISTRY.get_sample_value(f"{name}_total", {"model_name": MODEL}) or 0.0

    return value(regions.REGISTERED), value(regions.DEREGISTERED)


def _refuse(*_args):
    raise RuntimeError("Mooncake memory registration failed (ret=-1)")


def test_each_call_counts_the_regions_it_registered_or_deregistered():
    start = _held()
    engine = object()
    assert regions.around_batch_register(lambda e, p, l: 0, engine, [1, 2, 3], [8, 8, 8]) == 0
    assert regions.around_register(lambda e, p, l: None, engine, 4, 8) is None
    assert regions.around_batch_deregister(lambda e, p: 0, engine, [1, 2]) == 0
    assert regions.around_deregister(lambda e, p: None, engine, 4) is None
    registered, deregistered = _held()
    assert (registered - start[0], deregistered - start[1]) == (4, 3)


def test_failed_calls_count_nothing():
    start = _held()
    engine = object()
    assert regions.around_batch_register(lambda e, p, l: -1, engine, [1, 2], [8, 8]) == -1
    assert regions.around_batch_deregister(lambda e, p: -1, engine, [1, 2]) == -1
    with pytest.raises(RuntimeError, match="registration failed"):
        regions.around_register(_refuse, engine, 1, 8)
    with pytest.raises(RuntimeError):
        regions.around_deregister(_refuse, engine, 1)
    assert _held() == start
