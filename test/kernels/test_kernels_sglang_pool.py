"""The kernels on SGLang 0.5.23's own DeepSeekV4TokenToKVPool (built on CPU in a fresh process by
sglang_pool_check.py), in both layouts SGLang picks: v41 (SM100/SM103) and v4 (H200). The layout
table equals SGLang's KVLayout; on v41 the gather of a 429-token request (B = 301) equals the rows the
plugin's own pool_payload wrote, and after the scatter into a second pool at other pages the plugin's
reader sees them; on both layouts Triton's interpreter and the torch reference agree byte for byte."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENCODER = [f"swa.L{i}" for i in range(20)]
OWNERS = ("2", "8", "14")


@pytest.fixture(scope="module")
def report() -> dict:
    env = dict(os.environ, SGLANG_PLUGINS="sglang_asym", PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, str(REPO / "test/kernels/sglang_pool_check.py")], capture_output=True,
                          text=True, timeout=300, env=env, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


def test_layout_table_equals_sglangs_kv_layout(report) -> None:
    names = ("v4", "v41", "v41_fp4", "uniform_fp8", "v41_new", "v41_fp4_new")
    assert report["layouts"] == {f"{n}/{p}": True for n in names for p in (256, 128, 64)}


@pytest.mark.parametrize("main,kv_row,swa_row,compressed", [("v41", 288, 528, "v41_fp4"), ("v4", 584, 584, "v4")])
def test_every_manifest_group_moves_through_sglangs_pool(report, main, kv_row, swa_row, compressed) -> None:
    facts = report[main]
    assert facts["compressed_layouts"] == {"1": [compressed, compressed], "2": [compressed, compressed]}
    assert facts["index_fp4"] == {"1": True, "2": True}
    expected_groups = []
    for o in OWNERS:
        expected_groups += [[f"kv.L{o}", 150, kv_row], [f"index.L{o}", 150, 68], [f"tail.L{o}", 1, 4096]]
    expected_groups += [["kv.L20", 301, kv_row], ["index.L20", 301, 68]] + [[g, 127, swa_row] for g in ENCODER]
    assert facts["groups"] == expected_groups
    assert (facts["gather_backends_equal"], facts["scatter_torch_roundtrip"], facts["scatter_triton_roundtrip"],
            facts["scatter_backends_equal"]) == (True, True, True, True)
    assert facts["buffers_changed"] == sorted(
        ["index.c1.0", "index.c2.0", "index.c2.1", "index.c2.2", "kv.c1.0", "kv.c2.0", "kv.c2.1", "kv.c2.2",
         "ring.2", "ring.8", "ring.14"] + [f"swa.{i}" for i in range(20)])


def test_v41_gather_and_scatter_agree_with_the_plugins_pool_payload(report) -> None:
    assert report["v41"]["gather_equals_plugin_rows"] is True
    assert report["v41"]["plugin_reads_scattered_rows"] is True
