"""The bootstrap server speaks SGLang 0.5.23's routes, bodies and statuses."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from sglang_asym.transfer import bootstrap_client as client
from sglang_asym.transfer.bootstrap import BootstrapServer

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(method: str, url: str, body=None) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with OPENER.open(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def registration(**overrides) -> dict:
    body = {"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1,
            "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
            "rank_ip": "127.0.0.1", "rank_port": 40001, "page_size": 256, "kv_cache_dtype": "fp8_e4m3"}
    body.update(overrides)
    return body


@pytest.fixture()
def server():
    srv = BootstrapServer("127.0.0.1", 0, entry_cleanup_interval_s=0.3)
    yield srv
    srv.close()


def route(server, dp, cp, tp, pp) -> str:
    return (f"http://{server.address}/route?prefill_dp_rank={dp}&prefill_cp_rank={cp}"
            f"&target_tp_rank={tp}&target_pp_rank={pp}")


def test_health_and_method_checks(server) -> None:
    assert http("GET", f"http://{server.address}/health") == (200, "OK")
    assert http("POST", f"http://{server.address}/route", {}) == (405, "Method not allowed")
    assert http("GET", f"http://{server.address}/route?prefill_dp_rank=0") == (
        400, "Missing inputs for bootstrap server.")
    assert http("GET", route(server, -1, -1, -1, -1)) == (
        503, "Prefill server not fully registered yet (0 workers registered).")


def test_register_and_query_exact_json(server) -> None:
    assert http("PUT", f"http://{server.address}/route", registration(prefill_http_port=30000)) == (200, "OK")
    status, text = http("GET", route(server, -1, -1, -1, -1))
    assert status == 200
    assert json.loads(text) == {
        "attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 256,
        "kv_cache_dtype": "fp8_e4m3", "follow_bootstrap_room": True, "enable_dsa_cache_layer_split": False,
        "decode_allocation_policy": "early", "enable_kv_cache_sharding": False, "prefill_http_port": 30000,
        "target_tp_rank": None, "target_tp_ranks": None, "target_cp_ranks": None, "target_pp_ranks": None,
        "required_dst_info_num": None, "required_prefill_response_num": None}
    assert list(json.loads(text))[:6] == ["attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size",
                                          "kv_cache_dtype"]
    assert http("GET", route(server, 0, 0, 0, 0)) == (200, '{"rank_ip": "127.0.0.1", "rank_port": 40001}')
    assert http("GET", route(server, 1, 0, 0, 0)) == (
        404, "Bootstrap info not found for dp_rank=1 cp_rank=0 tp_rank=0 pp_rank=0")


def test_optional_layout_keys_appear_when_set(server) -> None:
    layout = {"num_draft_tokens": 3}
    http("PUT", f"http://{server.address}/route", registration(kv_layout="asym-v1", dsv41_spec_layout=layout))
    info = json.loads(http("GET", route(server, -1, -1, -1, -1))[1])
    assert (info["kv_layout"], info["dsv41_spec_layout"]) == ("asym-v1", layout)


def test_inconsistent_ranks_are_refused(server) -> None:
    url = f"http://{server.address}/route"
    assert http("PUT", url, registration(attn_tp_size=2)) == (200, "OK")
    assert http("GET", route(server, -1, -1, -1, -1))[0] == 503  # 1 of 2 ranks registered
    assert http("PUT", url, registration(attn_tp_size=2, attn_tp_rank=1, decode_allocation_policy="late")) == (
        400, "Inconsistent prefill allocation policies")
    assert http("PUT", url, registration(attn_tp_size=2, attn_tp_rank=1, dsv41_spec_layout={"x": 1})) == (
        400, "DeepSeek-V4.1 DSpark PD layout differs across prefill ranks")
    assert http("PUT", url, registration(attn_tp_size=2, attn_tp_rank=1, rank_port=40002)) == (200, "OK")
    assert http("GET", route(server, 0, 0, 1, 0)) == (200, '{"rank_ip": "127.0.0.1", "rank_port": 40002}')
    body = registration()
    del body["rank_port"]
    assert http("PUT", url, body) == (500, "Missing field 'rank_port' in prefill registration")


def test_dp_rank_table_and_expiry(server) -> None:
    addr = server.address
    client.register_dp_rank(addr, room=(1 << 63) - 1, dp_rank=3)
    client.register_dp_rank(addr, room=7, dp_rank=1)
    assert client.query_dp_ranks(addr, [7, (1 << 63) - 1, 8]) == {7: 1, (1 << 63) - 1: 3}
    assert http("POST", f"http://{addr}/query_dp_ranks", {"bootstrap_rooms": [7]}) == (200, '{"7": 1}')
    time.sleep(1.0)  # entries older than the cleanup interval (0.3 s) are dropped
    assert client.query_dp_ranks(addr, [7]) == {}


def test_client_round_trip(server) -> None:
    addr = server.address
    assert client.health(addr)
    reg = client.RankRegistration(rank_ip="127.0.0.1", rank_port=41000, page_size=64, kv_cache_dtype="auto")
    client.register_prefill_rank(addr, reg)
    assert client.fetch_server_info(addr)["page_size"] == 64
    assert client.fetch_rank(addr, 0, 0, 0, 0) == ("127.0.0.1", 41000)
    with pytest.raises(client.BootstrapError,
                       match="HTTP 404: Bootstrap info not found for dp_rank=0 cp_rank=0 tp_rank=3"):
        client.fetch_rank(addr, 0, 0, 3, 0)


def test_client_reports_an_unreachable_server() -> None:
    srv = BootstrapServer("127.0.0.1", 0)
    addr = srv.address
    srv.close()
    assert not client.health(addr)
    with pytest.raises(client.BootstrapError, match=f"bootstrap server http://{addr}/route.*unreachable"):
        client.fetch_server_info(addr, timeout_s=1)


def test_port_in_use_is_a_clear_error(server) -> None:
    with pytest.raises(RuntimeError, match=f"bootstrap server on 127.0.0.1:{server.port} did not start"):
        BootstrapServer("127.0.0.1", server.port)
