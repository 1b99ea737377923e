"""Pure pieces of the transfer layer: runs, registered regions, compat, config, checksums, pools."""

from __future__ import annotations

import threading
import time

from crc32c import crc32c
import numpy as np
import pytest
import torch
from transfer_cases import COMPAT, OTHER_COMPAT, ROW_FORMATS

from sglang_asym.manifest import PayloadManifest, RowGroup
from sglang_asym.transfer import KVPoll, RowFormat, RowPool, TransferCompat, TransferConfig
from sglang_asym.transfer.checksum import checksum_rows, crc_rows
from sglang_asym.transfer.errors import UnregisteredMemoryError
from sglang_asym.transfer.loops import TaskWorker
from sglang_asym.transfer.regions import RegisteredRegions
from sglang_asym.transfer.runs import coalesce_slots, expand_runs, pack_runs, paired_runs, unpack_runs


def test_kvpoll_matches_sglang_numbers() -> None:
    assert [(p.name, int(p)) for p in KVPoll] == [
        ("Failed", 0), ("Bootstrapping", 1), ("WaitingForInput", 2), ("Transferring", 3), ("Success", 4)]
    assert [p.is_terminal for p in KVPoll] == [True, False, False, False, True]


def test_runs() -> None:
    assert coalesce_slots(np.array([5, 6, 7, 2, 3, 9])).tolist() == [[5, 3], [2, 2], [9, 1]]
    assert coalesce_slots(np.array([], dtype=np.int64)).shape == (0, 2)
    assert expand_runs([(5, 3), (2, 2), (9, 1)]).tolist() == [5, 6, 7, 2, 3, 9]
    assert expand_runs(np.zeros((0, 2))).tolist() == []
    with pytest.raises(ValueError, match=r"invalid slot run \(start=1, length=0\)"):
        expand_runs([(4, 2), (1, 0)])
    with pytest.raises(ValueError, match=r"invalid slot run \(start=-3, length=2\)"):
        expand_runs([(-3, 2)])
    slots = np.random.default_rng(0).permutation(5000)[:3000]
    packed = pack_runs(coalesce_slots(slots))
    assert len(packed) == 16 * len(coalesce_slots(slots))
    assert expand_runs(unpack_runs(packed)).tolist() == slots.tolist()
    with pytest.raises(ValueError, match="packed slot runs must be a multiple of 16 bytes, got 15"):
        unpack_runs(b"x" * 15)
    src, dst, n = paired_runs(np.array([0, 1, 2, 3, 10, 11]), np.array([7, 8, 20, 21, 22, 23]))
    assert (src.tolist(), dst.tolist(), n.tolist()) == ([0, 2, 10], [7, 20, 22], [2, 2, 2])
    with pytest.raises(ValueError, match="3 source slots but 2 destination slots"):
        paired_runs(np.arange(3), np.arange(2))


def test_registered_regions() -> None:
    regions = RegisteredRegions()
    regions.add(1000, 100)
    regions.add(5000, 50)
    regions.check(np.array([1000, 1090, 5000]), np.array([100, 10, 50]))
    with pytest.raises(UnregisteredMemoryError, match=r"source range \[0x41a, \+100\) is not inside"):
        regions.check(np.array([1000, 1050]), np.array([10, 100]))  # runs past the end
    with pytest.raises(UnregisteredMemoryError, match=r"\[0x3e7, \+1\)"):
        regions.check(np.array([999]), np.array([1]))
    with pytest.raises(ValueError, match="overlaps a registered region"):
        regions.add(1099, 10)
    regions.remove(1000)
    with pytest.raises(UnregisteredMemoryError, match=r"\(1 registered\)"):
        regions.check(np.array([1000]), np.array([1]))
    with pytest.raises(ValueError, match="no registered region starts at 0x3e8"):
        regions.remove(1000)


def test_compat_mismatch_lists_every_difference() -> None:
    assert COMPAT.mismatch(COMPAT) is None
    formats = tuple(RowFormat(f.group, f.row_bytes + (4 if f.group == "L20.kv" else 0), f.encoding)
                    for f in ROW_FORMATS if f.group != "tails")
    other = TransferCompat(COMPAT.model_config_hash, formats, page_size=64, window=256, semantics="asym")
    assert COMPAT.mismatch(other) == ("page_size: 256 != 64; window: 128 != 256; "
                                      "row format 'L20.kv': 288 B fp8_e4m3+ue8m0 != 292 B fp8_e4m3+ue8m0; "
                                      "row format 'tails': 4096 B fp32_pair_state != missing")
    assert COMPAT.mismatch(OTHER_COMPAT) == ("model_config_hash: 'sha256:test-model' != 'sha256:other-model'; "
                                             "semantics: 'asym' != 'decoder-replay'")


def test_compat_validation_and_manifest_check() -> None:
    with pytest.raises(ValueError, match="semantics must be one of"):
        TransferCompat("h", (), 256, 128, "fast")
    with pytest.raises(ValueError, match="duplicate row format groups"):
        TransferCompat("h", (RowFormat("a", 1, "x"), RowFormat("a", 1, "x")), 256, 128, "exact")
    COMPAT.check_manifest(PayloadManifest((RowGroup("L2.kv", 288, 4),)))
    with pytest.raises(ValueError, match="manifest group 'L2.kv' has 290 B rows, its row format says 288 B"):
        COMPAT.check_manifest(PayloadManifest((RowGroup("L2.kv", 290, 4),)))
    with pytest.raises(ValueError, match="manifest group 'L99.kv' has no row format"):
        COMPAT.check_manifest(PayloadManifest((RowGroup("L99.kv", 288, 4),)))


@pytest.mark.parametrize("field, value, message", [
    ("peer_timeout_s", 0.5, r"peer_timeout_s \(0.5\) must exceed heartbeat_interval_s \(1.0\)"),
    ("write_timeout_s", 0, "write_timeout_s must be an int >= 1"),
    ("max_batch_entries", 2000, r"max_batch_entries must be in \[1, 1024\]"),
    ("tick_s", 0, "tick_s must be positive"),
    ("quarantine_grace_s", -1, "quarantine_grace_s must be >= 0"),
])
def test_config_validation(field, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        TransferConfig(**{field: value})


def test_checksum_follows_row_order_over_scattered_slots() -> None:
    pool = RowPool("kv", torch.arange(10 * 4, dtype=torch.uint8).reshape(10, 4))
    slots = np.array([7, 8, 2, 3, 4])
    expected = crc32c(bytes(pool.array[slots].tobytes()))
    assert crc_rows(pool, slots) == expected
    assert checksum_rows(pool, "kv", slots).crc32c == expected and checksum_rows(pool, "kv", slots).rows == 5
    assert crc_rows(pool, slots[2:], crc_rows(pool, slots[:2])) == expected  # incremental == whole
    assert crc_rows(pool, np.array([2, 3, 4, 7, 8])) != expected  # order matters


def test_row_pool_checks() -> None:
    with pytest.raises(ValueError, match="RowPool 'x' needs a contiguous 2-D uint8 tensor"):
        RowPool("x", torch.zeros(4, 4, dtype=torch.float32))
    pool = RowPool.zeros("kv", 16, 288)
    assert (pool.num_slots, pool.row_bytes, pool.nbytes, pool.base_ptr) == (16, 288, 4608, pool.tensor.data_ptr())
    with pytest.raises(ValueError, match="slot out of range for pool 'kv' \\(min 0, max 16, pool has 16\\)"):
        pool.check_slots(np.array([0, 16]), "source slots")


def test_task_worker_is_idle_only_with_nothing_queued_or_running() -> None:
    worker = TaskWorker("test-worker")
    gate, ran = threading.Event(), []
    try:
        assert worker.idle
        worker.submit(gate.wait, 5.0)
        worker.submit(ran.append, 1)
        assert not worker.idle
        gate.set()
        deadline = time.monotonic() + 5.0
        while not worker.idle and time.monotonic() < deadline:
            time.sleep(0.001)
        assert worker.idle and ran == [1]
    finally:
        gate.set()
        worker.stop()
