"""Client side of the SGLang bootstrap protocol (see bootstrap.py for the routes).

The prefill worker registers its rank (its ZMQ control endpoint) with PUT /route; the
decode worker finds it with GET /route, first with all ranks -1 (server info: page size,
topology), then with the concrete dp/cp/tp/pp rank.
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


def fetch_server_info(addr: str, timeout_s: float = 5.0) -> dict:
    return json.loads(_ok("GET", _route_url(addr, -1, -1, -1, -1), None, timeout_s))


def fetch_rank(addr: str, dp: int, cp: int, tp: int, pp: int, timeout_s: float = 5.0) -> tuple[str, int]:
    info = json.loads(_ok("GET", _route_url(addr, dp, cp, tp, pp), None, timeout_s))
    return str(info["rank_ip"]), int(info["rank_port"])


def register_dp_rank(addr: str, room: int, dp_rank: int, timeout_s: float = 5.0) -> None:
    _ok("POST", f"http://{addr}/register_dp_rank", {"bootstrap_room": room, "dp_rank": dp_rank}, timeout_s)


def query_dp_ranks(addr: str, rooms: list[int], timeout_s: float = 5.0) -> dict[int, int]:
    found = json.loads(_ok("POST", f"http://{addr}/query_dp_ranks", {"bootstrap_rooms": rooms}, timeout_s))
    return {int(k): int(v) for k, v in found.items()}
