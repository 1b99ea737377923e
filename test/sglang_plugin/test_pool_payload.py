"""The asymmetric payload against SGLang's own DeepSeekV4TokenToKVPool (v41 layout, built on CPU).

Our prefill role computes [0, B) of a 429-token prompt (B = 301: odd, two pages) at the release's
cache formats; its packed rows are written into one SGLang pool at a request's pages, read back
(also through SGLang's own index-key readers), moved by SGLang's Mooncake transfer planner
(`_send_kvcache_generic`, the engine write replaced by a local copy) into a second pool at other
pages, and read back there: row for row and byte for byte equal to the SplitPlan manifest's groups."""

import json

import pytest

from sglang_asym.formats.codec import E2M1_LEVELS
from harness.sglang_shapes import sglang_small
from sglang_asym.split import SplitPlan

from .conftest import REPO, run_python

CFG = sglang_small()
SPLIT = SplitPlan(CFG, 429, 128, "asym-exact-encoder")
ENCODER = range(20)


@pytest.fixture(scope="module")
def report():
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "payload", "429"])
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


def test_the_payload_is_the_split_plans_manifest(report):
    manifest = SPLIT.manifest("release").nonempty()
    assert report["boundary"] == 301
    assert report["manifest"] == [[g.name, g.num_rows, g.row_bytes] for g in manifest.groups]
    assert {g.name for g in manifest.groups} == (
        {f"{k}.L{o}" for k in ("kv", "index") for o in (2, 8, 14, 20)}
        | {f"tail.L{o}" for o in (2, 8, 14)} | {f"swa.L{i}" for i in ENCODER})


def test_rows_read_back_byte_for_byte_from_the_sending_pool(report):
    assert report["p_readback_equal"] == {g: True for g in report["p_readback_equal"]}
    assert len(report["p_readback_equal"]) == 31


def test_sglangs_index_key_readers_see_our_rows(report):
    # get_index_k_fp4 returns the stored payload and scale bytes; get_index_k_dequant decodes them
    # with SGLang's fp4 table and ue8m0 scales: both equal our rows and our decoder's values
    assert report["index_readback"] == {f"index.L{o}": {"bytes_equal": True, "dequant_equal": True,
                                                         "dequant_nonzero": True} for o in (2, 8, 14, 20)}
    assert report["sglang_fp4_table"] == list(E2M1_LEVELS) + [-v for v in E2M1_LEVELS]


def test_sglangs_transfer_sends_exactly_the_manifests_buffers(report):
    contiguous = ["kv.c1.L20", "index.c1.L20", "kv.c2.L2", "kv.c2.L8", "kv.c2.L14",
                  "index.c2.L2", "index.c2.L8", "index.c2.L14"]
    rings = ["pair_ring.L2", "pair_ring.L8", "pair_ring.L14"]
    assert report["plan"] == [["contiguous", contiguous, [3, 1]],
                              ["state", [f"swa.L{i}" for i in ENCODER], [1, 0]],
                              ["request_state", rings, [2]]]
    assert sorted(report["d_changed"]) == sorted(contiguous + rings + [f"swa.L{i}" for i in ENCODER])
    # semantics 'asym' ships no window rows, so no SWA entry; N <= W ships nothing at all
    assert report["asym_plan"] == [["contiguous", contiguous, [3, 1]], ["request_state", rings, [2]]]
    assert report["short_plan"] == 0


def test_the_receiving_pool_holds_the_manifest_rows_byte_for_byte(report):
    assert report["d_readback_equal"] == {g: True for g in report["d_readback_equal"]}
    assert len(report["d_readback_equal"]) == 31


def test_sglang_moves_whole_pages(report):
    """SGLang's unit is the page item: every entry moves its item length per page index, so the
    bytes on the wire exceed the manifest's by the page rounding (documented)."""
    sent, items = report["sent_bytes"], report["item_lens"]
    pages = {"contiguous": 2, "swa": 2, "ring": 1}
    for entry, nbytes in sent.items():
        kind = "swa" if entry.startswith("swa.") else "ring" if entry.startswith("pair_ring.") else "contiguous"
        assert nbytes == pages[kind] * items[entry], entry
    manifest = {g.name: g.nbytes for g in SPLIT.manifest("release").groups}
    assert manifest["kv.L20"] == 301 * 288 and sent["kv.c1.L20"] == 2 * 256 * 288
    assert manifest["tail.L2"] == 4096 and sent["pair_ring.L2"] == 2 * 4096
    assert manifest["swa.L0"] == 127 * 528 and sent["swa.L0"] == 2 * 256 * 528
    assert (sum(manifest.values()), sum(sent.values())) == (1620764, 5886976)


ASYM_CHANGED = sorted(["kv.c1.L20", "index.c1.L20", "kv.c2.L2", "kv.c2.L8", "kv.c2.L14", "index.c2.L2",
                       "index.c2.L8", "index.c2.L14", "pair_ring.L2", "pair_ring.L8", "pair_ring.L14"])


@pytest.mark.parametrize("semantics", ["asym-exact-encoder", "asym"])
def test_sglangs_own_sender_with_the_asym_registration_moves_exactly_the_payload(report, semantics):
    """The production path: the plugin's `setup_state_kv_args` hook registers both roles (layer ids;
    P only its payload's entries); SGLang's unmodified `send_kvcache` + `maybe_send_extra`, with the
    indices SGLang's prefill computes for a request cut to B, deliver the manifest rows to D."""
    result = report["production"][semantics]
    assert result["rc"] == [0, 0]
    encoder = list(ENCODER) if semantics == "asym-exact-encoder" else []
    assert result["p_state_layer_ids"] == [["StateType.SWA", "StateType.DSV4_REQUEST_STATE"], [encoder, [2, 8, 14]]]
    assert result["d_state_layer_ids"] == [list(range(40)), [2, 8, 14]]
    assert result["kv_layer_ids"] == [[20, 20, 2, 8, 14, 2, 8, 14]] * 2
    assert sorted(result["changed"]) == sorted(ASYM_CHANGED + [f"swa.L{i}" for i in encoder])
    groups = {g.name for g in SplitPlan(CFG, 429, 128, semantics).manifest("release").nonempty().groups}
    assert result["back_equal"] == {g: True for g in groups}
    assert result["bytes"] == {"asym-exact-encoder": 5886976, "asym": 480256}[semantics]


@pytest.mark.parametrize("semantics", ["asym-exact-encoder", "asym"])
def test_the_exact_payload_manager_writes_the_manifest_and_nothing_else(report, semantics):
    """The asym-prefill server's Mooncake manager (exact_payload.py): its send_kvcache (one page per
    chunk) and maybe_send_extra write the manifest's rows at D's slots, byte for byte, and the bytes
    written are the manifest's total, against SGLang's page items (5.9 MB for 1.6 MB at N = 429)."""
    result = report["exact"][semantics]
    assert result["rc"] == [0, 0, 0]
    groups = {g.name for g in SplitPlan(CFG, 429, 128, semantics).manifest("release").nonempty().groups}
    assert result["back_equal"] == {g: True for g in groups}
    manifest = {"asym-exact-encoder": 1620764, "asym": 1620764 - 20 * 127 * 528}[semantics]
    assert result["manifest_bytes"] == manifest
    assert result["bytes"] == result["room_bytes"] == manifest
    encoder = [f"swa.L{i}" for i in ENCODER] if semantics == "asym-exact-encoder" else []
    assert sorted(result["changed"]) == sorted(ASYM_CHANGED + encoder)
    # SGLang's own sender, same request and registration: 3.6x (asym-exact-encoder), 1.7x (asym)
    assert report["production"][semantics]["bytes"] == {"asym-exact-encoder": 5886976, "asym": 480256}[semantics]


def test_a_speculating_decode_peer_gets_the_pending_token_in_its_own_ring_row(report):
    """A decode server that speculates keeps 8 pair-ring rows per request (SGLang sizes the ring for the
    draft tokens), P keeps 2. B = 301 is odd: the pending compressor token goes to row (B - 1) mod 8 = 4
    of D's ring, where D reads it, not to P's row 0; every other group lands as before."""
    result = report["speculating"]
    assert result["ring_rows"] == [[2], [8]]
    assert result["rc"] == [0, 0, 0]
    groups = {g.name for g in SPLIT.manifest("release").nonempty().groups}
    assert result["back_equal"] == {g: True for g in groups}
    assert result["bytes"] == result["room_bytes"] == 1620764


# ---- the same payload in SGLang's `v4` pool layout (what it picks on an H200) -----------------------

@pytest.fixture(scope="module")
def report_v4():
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "payload", "429", "v4"])
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


def test_in_a_v4_pool_kv_and_window_rows_are_v4_rows_and_index_keys_stay_mxfp4(report_v4):
    # 448 fp8 nope + 64 bf16 rope = 576 data bytes, 7 ue8m0 scales + 1 pad
    manifest = SPLIT.manifest("v4").nonempty()
    assert report_v4["manifest"] == [[g.name, g.num_rows, g.row_bytes] for g in manifest.groups]
    widths = {g.name.split(".")[0]: g.row_bytes for g in manifest.groups}
    assert widths == {"kv": 584, "index": 68, "tail": 4096, "swa": 584}
    assert manifest.total_bytes == 751 * 584 + 751 * 68 + 3 * 4096 + 20 * 127 * 584 == 1985300


def test_v4_rows_read_back_byte_for_byte_from_both_pools(report_v4):
    for side in ("p_readback_equal", "d_readback_equal"):
        assert report_v4[side] == {g: True for g in report_v4[side]} and len(report_v4[side]) == 31


def test_sglangs_own_v4_reader_decodes_our_rows_to_our_values(report_v4):
    """SGLang's pure-torch dequantizer of its V4 pages reads our window and compressed-KV rows at their
    slots and returns our decoder's values bit for bit (bf16)."""
    groups = [f"kv.L{o}" for o in (2, 8, 14, 20)] + [f"swa.L{i}" for i in ENCODER]
    assert report_v4["v4_readback"] == {g: {"equal": True, "nonzero": True} for g in groups}
    assert report_v4["index_readback"] == {f"index.L{o}": {"bytes_equal": True, "dequant_equal": True,
                                                            "dequant_nonzero": True} for o in (2, 8, 14, 20)}


@pytest.mark.parametrize("semantics", ["asym-exact-encoder", "asym"])
def test_both_senders_deliver_the_v4_payload(report_v4, semantics):
    groups = {g.name for g in SplitPlan(CFG, 429, 128, semantics).manifest("v4").nonempty().groups}
    exact, production = report_v4["exact"][semantics], report_v4["production"][semantics]
    assert exact["rc"] == [0, 0, 0] and production["rc"] == [0, 0]
    assert exact["back_equal"] == production["back_equal"] == {g: True for g in groups}
    manifest = {"asym-exact-encoder": 1985300, "asym": 1985300 - 20 * 127 * 584}[semantics]
    assert exact["bytes"] == exact["room_bytes"] == exact["manifest_bytes"] == manifest
    # SGLang's whole page items: 576-aligned pages of 256 slots of 584 bytes (149,760 B per SWA page)
    assert production["bytes"] == {"asym-exact-encoder": 6850816, "asym": 860416}[semantics]
