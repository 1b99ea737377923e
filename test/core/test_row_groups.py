"""Row-group identities (`cache/groups.py`): one parse/format pair, one kind -> format table, and no other
module of the package taking group names apart by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sglang_asym.cache import KIND_FORMATS, GroupId, GroupKind, cache_group, parse_group
from sglang_asym.cache.groups import row_count
from sglang_asym.config import V41Config
from sglang_asym.split import SplitPlan

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sglang_asym"
HOME = "cache/groups.py"
HAND_PARSING = re.compile(r"""split\(\s*["']\.L["']\s*\)|startswith\(\s*["'](swa|kv|index|tail)\.?["']\s*\)""")


def test_parse_and_format_round_trip():
    assert parse_group("kv.L12") == GroupId(GroupKind.KV, 12)
    assert GroupId(GroupKind.SWA, 0).name == "swa.L0" and str(GroupId("tail", 3)) == "tail.L3"
    for kind in GroupKind:
        assert parse_group(GroupId(kind, 7).name) == GroupId(kind, 7)


@pytest.mark.parametrize("name", ["kv.L", "kv.Lx", "kv.L-1", "pair_ring.L2", "swa.L3 ", "kv.c4.L2", "aux.first_token"])
def test_names_that_are_not_cache_groups(name):
    assert cache_group(name) is None
    with pytest.raises(ValueError, match="is not a cache row group"):
        parse_group(name)


def test_bad_identities_are_refused():
    with pytest.raises(ValueError):
        GroupId("ring", 1)
    with pytest.raises(ValueError, match="non-negative integer"):
        GroupId(GroupKind.KV, -1)


def test_kind_table_gives_the_manifest_row_bytes():
    cfg = V41Config.flash()
    assert {k.value: f.release for k, f in KIND_FORMATS.items()} == {"swa": "fp8", "kv": "nvfp4", "index": "mxfp4",
                                                                      "tail": None}
    # Flash: head_dim 512, index_head_dim 128
    assert [GroupId(k, 2).row_bytes(cfg, "release", torch.bfloat16) for k in GroupKind] == [528, 288, 68, 4096]
    assert [GroupId(k, 2).row_bytes(cfg, "model", torch.bfloat16) for k in GroupKind] == [1024, 1024, 256, 4096]
    manifest = SplitPlan(cfg, 1025, 128).manifest("release")
    assert all(g.row_bytes == parse_group(g.name).row_bytes(cfg, "release", torch.float32) for g in manifest.groups)
    with pytest.raises(ValueError, match="row format must be one of"):
        GroupId(GroupKind.KV, 2).row_bytes(cfg, "fp8", torch.bfloat16)


def streams(name: str) -> bool:
    """A cache group whose rows ship chunk by chunk (kv, index)."""
    group = cache_group(name)
    return group is not None and group.kind.streams


def ships_at_end(name: str) -> bool:
    """A cache group whose rows ship once the prefix is done (swa, tail); aux rows are neither."""
    group = cache_group(name)
    return group is not None and not group.kind.streams


def tokens_per_row(gid: GroupId, cfg: V41Config) -> int:
    """Prompt tokens one row covers: 1 for window rows, the owner's compress ratio for kv/index, 0 for tails."""
    if gid.kind is GroupKind.SWA:
        return 1
    return 0 if gid.kind is GroupKind.TAIL else cfg.compress_ratios[gid.layer]


def test_what_ships_when_and_row_counts():
    assert [streams(n) for n in ("kv.L2", "index.L2", "swa.L0", "tail.L2", "aux.rng_state")] == [True, True, False, False, False]
    assert [ships_at_end(n) for n in ("kv.L2", "index.L2", "swa.L0", "tail.L2", "aux.rng_state")] == [False, False, True, True, False]
    assert row_count("tail.L2", torch.zeros(2, 8)) == 1 and row_count("kv.L2", torch.zeros(5, 8)) == 5
    cfg = V41Config.flash()
    assert [tokens_per_row(GroupId(k, 2), cfg) for k in GroupKind] == [1, cfg.compress_ratios[2], cfg.compress_ratios[2], 0]


def test_no_module_parses_group_names_by_hand():
    found = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if HAND_PARSING.search(p.read_text())}
    assert found - {HOME} == set(), f"parse row-group names with cache.groups.parse_group: {sorted(found - {HOME})}"
