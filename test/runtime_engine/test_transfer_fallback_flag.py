"""--transfer-fallback: asym-decode only, off by default, carried into EngineOptions; and P takes its
transfer rows for every group or none (a partial take under load used to leak until P refused all)."""

from __future__ import annotations

import pytest

from sglang_asym import launch_server
from sglang_asym.manifest import PayloadManifest, RowGroup
from sglang_asym.runtime.engine.disaggregated import AsymPrefillEngine
from sglang_asym.runtime.engine.options import EngineOptions
from sglang_asym.runtime.engine_api import EngineOverloadedError
from sglang_asym.transfer.slots import SlotAllocator


def _args(tmp_path, *flags):
    args = launch_server.build_parser().parse_args(["--model-path", str(tmp_path), *flags])
    launch_server.validate(args)
    return args


def test_fallback_is_off_by_default_and_set_on_decode(tmp_path):
    assert launch_server.engine_options(_args(tmp_path, "--disaggregation-mode", "asym-decode")).transfer_fallback == "off"
    args = _args(tmp_path, "--disaggregation-mode", "asym-decode", "--transfer-fallback", "recompute")
    assert launch_server.engine_options(args).transfer_fallback == "recompute"


@pytest.mark.parametrize("mode", ["null", "asym-prefill", "decode"])
def test_fallback_elsewhere_is_refused(tmp_path, mode):
    with pytest.raises(SystemExit, match="applies to --disaggregation-mode asym-decode only"):
        _args(tmp_path, "--disaggregation-mode", mode, "--transfer-fallback", "recompute")


def test_unknown_fallback_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--transfer-fallback must be one of"):
        EngineOptions(model_path=str(tmp_path), transfer_fallback="retry")


def test_prefill_rows_all_groups_or_none():
    engine = object.__new__(AsymPrefillEngine)  # only the allocators are used
    engine.allocators = {"kv.L1": SlotAllocator("kv.L1", 10), "swa.L0": SlotAllocator("swa.L0", 4)}
    manifest = PayloadManifest((RowGroup("kv.L1", 8, 6), RowGroup("swa.L0", 8, 3)))
    first = engine._allocate(manifest)
    assert {k: len(v) for k, v in first.items()} == {"kv.L1": 6, "swa.L0": 3}
    with pytest.raises(EngineOverloadedError, match="no free transfer rows: pool 'kv.L1': need 6 slots, 4 of 10"):
        engine._allocate(manifest)
    small = PayloadManifest((RowGroup("kv.L1", 8, 2), RowGroup("swa.L0", 8, 3)))
    with pytest.raises(EngineOverloadedError, match="pool 'swa.L0': need 3 slots, 1 of 4 free"):
        engine._allocate(small)
    assert engine.allocators["kv.L1"].num_free == 4  # the kv.L1 rows of the refused request went back
    engine._free(first)
    assert engine.allocators["kv.L1"].num_free == 10 and engine.allocators["swa.L0"].num_free == 4
