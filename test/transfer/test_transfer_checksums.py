"""P's running checksums (folded in as rows are handed over) and D's completion verifier
(inline for small payloads, split by group over threads for large ones); no engine needed."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from crc32c import crc32c
import numpy as np
import pytest
import torch

from sglang_asym.manifest import PayloadManifest, RowGroup
from sglang_asym.transfer import RowPool
from sglang_asym.transfer.checksum import GroupChecksum, RunningChecksums
from sglang_asym.transfer.decode_room import DecodeRoom
from sglang_asym.transfer.decode_verifier import INLINE_VERIFY_BYTES, CompletionVerifier
from sglang_asym.transfer.messages import TransferComplete


def random_pool(name: str, slots: int, row_bytes: int, seed: int) -> RowPool:
    data = np.random.default_rng(seed).integers(0, 256, size=(slots, row_bytes), dtype=np.uint8)
    return RowPool(name, torch.from_numpy(data))


def expected_crc(pool: RowPool, slots: np.ndarray) -> int:
    return crc32c(pool.array[slots].tobytes())


def test_running_checksums_equal_one_pass_over_the_rows() -> None:
    pools = {"kv": random_pool("kv", 64, 288, 1), "index": random_pool("index", 64, 68, 2)}
    slots = {"kv": np.random.default_rng(3).permutation(64)[:40], "index": np.arange(10, 30)}
    with ThreadPoolExecutor(3) as ex:
        sums = RunningChecksums(ex, pools, slots)
        for start, end in [(0, 7), (7, 8), (8, 40)]:      # kv in three ranges, index in two, interleaved
            sums.add("kv", start, end)
            if start == 0:
                sums.add("index", 0, 13)
        sums.add("index", 13, 20)
        assert sums.result(timeout_s=10) == (GroupChecksum("kv", 40, expected_crc(pools["kv"], slots["kv"])),
                                             GroupChecksum("index", 20, expected_crc(pools["index"], slots["index"])))


def test_running_checksums_wait_for_ranges_still_running() -> None:
    pools = {"kv": random_pool("kv", 8, 16, 4)}
    gate = threading.Event()
    with ThreadPoolExecutor(1) as ex:
        ex.submit(gate.wait)                             # the only thread is busy: the range must wait
        sums = RunningChecksums(ex, pools, {"kv": np.arange(8)})
        sums.add("kv", 0, 8)
        with pytest.raises(TimeoutError, match="checksums not done within 0.05 s"):
            sums.result(timeout_s=0.05)
        gate.set()
        assert sums.result(timeout_s=10) == (GroupChecksum("kv", 8, expected_crc(pools["kv"], np.arange(8))),)


def test_running_checksums_refuse_a_gap() -> None:
    pools = {"kv": random_pool("kv", 8, 16, 5)}
    with ThreadPoolExecutor(1) as ex:
        sums = RunningChecksums(ex, pools, {"kv": np.arange(8)})
        sums.add("kv", 0, 3)
        sums.add("kv", 4, 8)
        with pytest.raises(RuntimeError, match=r"group 'kv': rows \[4, 8\) do not follow row 3"):
            sums.result(timeout_s=10)


@pytest.mark.parametrize("rows", [100, INLINE_VERIFY_BYTES // 288 + 1000])   # inline, then split over threads
def test_verifier_accepts_exact_rows_and_names_the_first_bad_group(rows: int) -> None:
    manifest = PayloadManifest((RowGroup("kv", 288, rows), RowGroup("empty", 68, 0), RowGroup("index", 68, rows)))
    pools = {"kv": random_pool("kv", rows + 8, 288, 6), "empty": random_pool("empty", 4, 68, 7),
             "index": random_pool("index", rows + 8, 68, 8)}
    dest = {"kv": np.arange(rows)[::-1] + 8, "empty": np.zeros(0, dtype=np.int64), "index": np.arange(rows)}
    room = DecodeRoom(5, "127.0.0.1:1", manifest, dest, created_at=0.0)
    good = {"kv": expected_crc(pools["kv"], dest["kv"]), "empty": 0,
            "index": expected_crc(pools["index"], dest["index"])}
    verdicts: list[tuple[int, str | None]] = []
    done = threading.Event()

    def conclude(r: DecodeRoom, msg: TransferComplete, problem: str | None) -> None:
        verdicts.append((r.room, problem))
        done.set()

    def check(crcs: dict[str, int], counts: dict[str, int] | None = None) -> str | None:
        done.clear()
        counts = counts or {g.name: g.num_rows for g in manifest.groups}
        verifier.start(room, TransferComplete(5, tuple(GroupChecksum(g.name, counts[g.name], crcs[g.name])
                                                       for g in manifest.groups)))
        assert done.wait(10)
        return verdicts[-1][1]

    with ThreadPoolExecutor(2) as ex:
        verifier = CompletionVerifier(pools, ex, conclude)
        assert check(good) is None
        assert check({**good, "index": good["index"] ^ 1}) == (
            f"checksum mismatch in group 'index': destination rows crc32c={good['index']:#010x}, "
            f"prefill sent crc32c={good['index'] ^ 1:#010x}")
        pools["kv"].array[dest["kv"][rows // 2]] ^= 0xFF                 # a stray write on D
        assert check(good).startswith("checksum mismatch in group 'kv': destination rows crc32c=")
        assert check(good, {"kv": rows, "empty": 0, "index": rows - 1}) == (
            f"partial transfer: group 'index' has {rows - 1} of {rows} rows")
    assert len(verdicts) == 4 and {r for r, _ in verdicts} == {5}     # exactly one verdict per completion
