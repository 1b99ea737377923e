"""Our bootstrap server (transfer/bootstrap.py) and SGLang 0.5.23's own (MooncakeKVBootstrapServer =
CommonKVBootstrapServer) are interchangeable. In a fresh process, on 127.0.0.1 with free ports, the
same three scripts run against a fresh server of each kind:
  raw            every route and error as plain HTTP (status and body)
  sglang_client  SGLang's own prefill registration (`CommonKVManager.register_to_bootstrap`), decode
                 discovery (`try_ensure_parallel_info` -> PrefillServerInfo, `_get_bootstrap_info_from_server`),
                 room registration and query (`CommonKVSender` / `CommonKVReceiver`)
  our_client     transfer/bootstrap_client.py, errors included
and each script's transcript is identical on both servers."""

import json

import pytest

from .conftest import REPO, run_python

LAYOUT = "v41,c1:v41_fp4,c2:v41_fp4"
NULL_TARGETS = {"target_tp_rank": None, "target_tp_ranks": None, "target_cp_ranks": None, "target_pp_ranks": None,
                "required_dst_info_num": None, "required_prefill_response_num": None}


@pytest.fixture(scope="module")
def report():
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "bootstrap"], timeout=180,
                      extra_env={"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


def test_the_sglang_server_is_its_mooncake_bootstrap_server(report):
    assert report["sglang_server_class"] == ["MooncakeKVBootstrapServer", "CommonKVBootstrapServer"]


@pytest.mark.parametrize("script", ["raw", "sglang_client", "our_client"])
def test_both_servers_answer_every_script_identically(report, script):
    assert report[f"{script}/ours"] == report[f"{script}/sglang"]


def test_raw_routes_and_errors(report):
    not_ready = "Prefill server not fully registered yet ({} workers registered)."
    assert dict(report["raw/sglang"]) == {
        "health": [200, "OK"],
        "info before registration": [503, not_ready.format(0)],
        "rank before registration": [503, not_ready.format(0)],
        "missing inputs": [400, "Missing inputs for bootstrap server."],
        "empty input": [400, "Missing inputs for bootstrap server."],
        "method not allowed": [405, "Method not allowed"],
        "register rank 0": [200, "OK"],
        "info with 1 of 2": [503, not_ready.format(1)],
        "other allocation policy": [400, "Inconsistent prefill allocation policies"],
        "other DSpark layout": [400, "DeepSeek-V4.1 DSpark PD layout differs across prefill ranks"],
        "register rank 1": [200, "OK"],
        "info": [200, {"attn_tp_size": 2, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 256,
                       "kv_cache_dtype": "fp8_e4m3", "follow_bootstrap_room": True,
                       "enable_dsa_cache_layer_split": False, "kv_layout": LAYOUT,
                       "decode_allocation_policy": "early", "enable_kv_cache_sharding": False,
                       "prefill_http_port": 30000, **NULL_TARGETS}],
        "rank 1": [200, {"rank_ip": "10.0.0.5", "rank_port": 17002}],
        "unknown rank": [404, "Bootstrap info not found for dp_rank=0 cp_rank=0 tp_rank=2 pp_rank=0"],
        "register room": [200, "OK"],
        "query rooms": [200, {"7000000000000000001": 0}],
        # SGLang's handler raises KeyError (aiohttp's generic 500 page); ours names the field
        "registration missing a field: status": 500,
    }


def test_sglangs_client_code_on_our_server(report):
    result = report["sglang_client/ours"]
    assert result["info before registration"] is False  # 503: SGLang's decode keeps polling
    assert result["info"] is True
    assert result["server info"]["target_tp_rank"] == 1 and result["server info"]["kv_layout"] == LAYOUT
    assert result["rank 1"] == {"rank_ip": "10.0.0.7", "rank_port": 18001, "pp_rank": 0}
    assert result["unknown rank"] is None  # 404 -> SGLang logs and returns None
    assert result["rooms"] == {"7000000000000000001": 0}


def test_our_client_code_on_sglangs_server(report):
    result = report["our_client/sglang"]
    assert result["health"] is True
    assert result["info before registration"] == ["error", 503,
                                                  "Prefill server not fully registered yet (0 workers registered)."]
    assert result["other allocation policy"] == ["error", 400, "Inconsistent prefill allocation policies"]
    assert result["info"][0] == "ok" and result["info"][1]["kv_layout"] == LAYOUT
    assert result["rank 1"] == ["ok", ["10.0.0.9", 19001]]
    assert result["unknown rank"] == ["error", 404, "Bootstrap info not found for dp_rank=1 cp_rank=0 "
                                                    "tp_rank=0 pp_rank=0"]
    assert result["rooms"] == ["ok", {"7000000000000000001": 0}]
