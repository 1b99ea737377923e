"""Client side of the SGLang bootstrap protocol (see bootstrap.py for the routes).

The prefill worker registers its rank (its ZMQ control endpoint) with PUT /route; the
decode worker finds it with GET /route, first with all ranks -1 (server info: page size,
topology), then with the concrete dp/cp/tp/pp rank. Every answer is checked before use: a malformed
one is a BootstrapError naming what is wrong (`parse_*`).
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

# Bootstrap servers are reached directly, never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class BootstrapError(RuntimeError):
    def __init__(self, url: str, status: int | None, text: str):
        where = f"HTTP {status}" if status is not None else "unreachable"
        super().__init__(f"bootstrap server {url}: {where}: {text}")
        self.status = status
        self.text = text


@dataclass(frozen=True)
class RankRegistration:
    """Body of PUT /route for one prefill rank (field names are SGLang's)."""

    rank_ip: str
    rank_port: int
    page_size: int
    kv_cache_dtype: str
    kv_layout: str | None = None
    attn_tp_size: int = 1
    attn_tp_rank: int = 0
    attn_cp_size: int = 1
    attn_cp_rank: int = 0
    attn_dp_size: int = 1
    attn_dp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    system_dp_size: int = 1
    system_dp_rank: int = 0
    load_balance_method: str = "follow_bootstrap_room"
    decode_allocation_policy: str = "early"
    prefill_http_port: int | None = None


def _request(method: str, url: str, body: Any | None, timeout_s: float) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        raise BootstrapError(url, None, str(getattr(exc, "reason", exc))) from exc


def _ok(method: str, url: str, body: Any | None, timeout_s: float) -> str:
    status, text = _request(method, url, body, timeout_s)
    if status != 200:
        raise BootstrapError(url, status, text)
    return text


def health(addr: str, timeout_s: float = 5.0) -> bool:
    try:
        return _ok("GET", f"http://{addr}/health", None, timeout_s) == "OK"
    except BootstrapError:
        return False


def register_prefill_rank(addr: str, reg: RankRegistration, timeout_s: float = 5.0) -> None:
    _ok("PUT", f"http://{addr}/route", dataclasses.asdict(reg), timeout_s)


def _route_url(addr: str, dp: int, cp: int, tp: int, pp: int) -> str:
    return (f"http://{addr}/route?prefill_dp_rank={dp}&prefill_cp_rank={cp}"
            f"&target_tp_rank={tp}&target_pp_rank={pp}")


_TOPOLOGY = ("attn_tp_size", "attn_cp_size", "dp_size", "pp_size")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_object(url: str, text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BootstrapError(url, 200, f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BootstrapError(url, 200, f"{what} is not a JSON object: {text[:100]!r}")
    return value


def parse_server_info(url: str, text: str) -> dict:
    """GET /route with all ranks -1: the topology fields must be positive ints, page_size an int or null."""
    info = _json_object(url, text, "server info")
    for key in _TOPOLOGY:
        if not _is_int(info.get(key)) or info[key] < 1:
            raise BootstrapError(url, 200, f"server info field {key} must be a positive int, got {info.get(key)!r}")
    if info.get("page_size") is not None and not _is_int(info["page_size"]):
        raise BootstrapError(url, 200, f"server info field page_size must be an int, got {info['page_size']!r}")
    return info


def parse_rank(url: str, text: str) -> tuple[str, int]:
    """GET /route for one rank: {"rank_ip": str, "rank_port": int in [1, 65535]}."""
    info = _json_object(url, text, "rank info")
    ip, port = info.get("rank_ip"), info.get("rank_port")
    if not isinstance(ip, str) or not ip or not _is_int(port) or not 0 < port < 65536:
        raise BootstrapError(url, 200, f"rank info needs rank_ip (a host) and rank_port (1-65535), got {info!r}"[:300])
    return ip, port


def parse_dp_ranks(url: str, text: str) -> dict[int, int]:
    """POST /query_dp_ranks: {"<room>": dp_rank, ...}."""
    found = _json_object(url, text, "dp ranks")
    out = {}
    for key, rank in found.items():
        try:
            room = int(key)
        except ValueError:
            raise BootstrapError(url, 200, f"dp ranks: {key[:40]!r} is not a room number") from None
        if not _is_int(rank):
            raise BootstrapError(url, 200, f"dp ranks: room {room} has rank {rank!r}, not an int")
        out[room] = rank
    return out


def fetch_server_info(addr: str, timeout_s: float = 5.0) -> dict:
    url = _route_url(addr, -1, -1, -1, -1)
    return parse_server_info(url, _ok("GET", url, None, timeout_s))


def fetch_rank(addr: str, dp: int, cp: int, tp: int, pp: int, timeout_s: float = 5.0) -> tuple[str, int]:
    url = _route_url(addr, dp, cp, tp, pp)
    return parse_rank(url, _ok("GET", url, None, timeout_s))


def register_dp_rank(addr: str, room: int, dp_rank: int, timeout_s: float = 5.0) -> None:
    _ok("POST", f"http://{addr}/register_dp_rank", {"bootstrap_room": room, "dp_rank": dp_rank}, timeout_s)


def query_dp_ranks(addr: str, rooms: list[int], timeout_s: float = 5.0) -> dict[int, int]:
    url = f"http://{addr}/query_dp_ranks"
    return parse_dp_ranks(url, _ok("POST", url, {"bootstrap_rooms": rooms}, timeout_s))
