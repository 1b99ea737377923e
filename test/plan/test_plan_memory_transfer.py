"""Memory fit (footprint's accounting, byte for byte) and bytes on the wire per mode (the SplitPlan manifests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_asym.config import V41Config
from sglang_asym.split import SplitPlan
from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.gpus import gpu
from sglang_asym.plan.memory import min_replica_gpus, replica_fit, request_kv_bytes
from sglang_asym.plan.replica_layout import resident_role, resident_weight_bytes
from sglang_asym.plan.steptime import Role
from sglang_asym.plan.transfer_model import Link, Mode, exposed_transfer_s, payload_bytes

FOOTPRINT = Path(__file__).resolve().parents[2] / "benchmark" / "results" / "footprint_flash.json"


def test_role_weights_equal_footprint() -> None:
    fit = json.loads(FOOTPRINT.read_text())["fit"]
    weights = {role: resident_weight_bytes()[resident_role(role)] for role in Role}  # what each role keeps loaded
    assert weights[Role.ASYM_P] == fit["prefill_replica"]["weight_bytes_on_gpu"] == 149519555808
    # RFC #57738's draft keeps the full model loaded on P; a bounded-replay P is a full replica
    assert weights[Role.FULL] == weights[Role.RFC_P] == weights[Role.SYM_P] == \
        fit["full_replica"]["weight_bytes_on_gpu"] == 307917991752


@pytest.mark.parametrize("name, role, gpus", [
    ("B300", Role.ASYM_P, 1), ("GB200", Role.ASYM_P, 1), ("H200", Role.ASYM_P, 2),
    ("B300", Role.FULL, 2), ("GB200", Role.FULL, 2), ("H200", Role.FULL, 4),
])
def test_smallest_replicas(name: str, role: Role, gpus: int) -> None:
    assert min_replica_gpus(role, gpu(name), 8192, 8).gpus == gpus


def test_b300_prefill_replica_kv_space() -> None:
    fit = replica_fit(Role.ASYM_P, gpu("B300"), 1, 8192)
    assert fit.kv_bytes == pytest.approx(288e9 - 149519555808 - 12e9)  # ~126 GB, as the README says
    assert fit.max_requests_at_context == int(fit.kv_bytes // request_kv_bytes(Role.ASYM_P, 8192))


def test_request_kv_bytes_by_hand() -> None:
    # 890 B per token of global rows; window rows 528 B x 128 x 43 layers (full) or x 20 (P); 3 ratio-2 tails of 4096 B
    assert request_kv_bytes(Role.FULL, 1000) == 890 * 1000 + 43 * 528 * 128 + 3 * 4096
    assert request_kv_bytes(Role.ASYM_P, 100) == 890 * 100 + 20 * 528 * 100 + 3 * 4096
    with pytest.raises(PlanInputError):
        request_kv_bytes(Role.FULL, -1)


def test_no_replica_holds_an_absurd_batch() -> None:
    with pytest.raises(PlanInputError, match="no full replica of up to 8 H200 GPUs holds 1000000 requests"):
        min_replica_gpus(Role.FULL, gpu("H200"), 100_000, 1_000_000)


@pytest.mark.parametrize("n", [1, 128, 129, 1000, 4097])
def test_payload_bytes_are_the_manifests(n: int) -> None:
    cfg = V41Config.flash()
    assert payload_bytes(Mode.ASYM, n) == SplitPlan(cfg, n, 128).manifest("release").total_bytes
    assert payload_bytes(Mode.SYMMETRIC, n) == SplitPlan(cfg, n, 128).symmetric_manifest().total_bytes
    assert payload_bytes(Mode.RFC57738, n) == SplitPlan(cfg, n + 128, 128).manifest("release").total_bytes
    assert payload_bytes(Mode.COLOCATED, n) == 0


def test_payload_ordering() -> None:
    assert payload_bytes(Mode.ASYM, 128) == 0  # N <= W: nothing crosses
    assert payload_bytes(Mode.ASYM, 8192) < payload_bytes(Mode.RFC57738, 8192) < payload_bytes(Mode.SYMMETRIC, 8192)
    with pytest.raises(PlanInputError, match="prompt length"):
        payload_bytes(Mode.ASYM, 0)
    with pytest.raises(PlanInputError, match="unknown mode 'pd'"):
        payload_bytes("pd", 10)


def test_exposed_transfer() -> None:
    link = Link("x", 1e9, 0.001)
    # the last chunk's 10% of 1 GB after 2 s of compute: 0.1 s + latency
    assert exposed_transfer_s(link, 1e9, 2.0, 0.1) == pytest.approx(0.101)
    # the link is slower than the compute: wire time less the overlap
    assert exposed_transfer_s(link, 5e9, 2.0, 0.1) == pytest.approx(3.001)
    with pytest.raises(PlanInputError):
        exposed_transfer_s(link, 1, 1, 1.5)
    with pytest.raises(PlanInputError):
        Link("bad", 0, 0)
