"""Request fields shared by every generate route: rid and the router's bootstrap fields, single or batch.

For a batch of n prompts each field may be one value for all or a list of n values (the router sends
lists of bootstrap fields when an OpenAI `prompt` is a list).
"""

from __future__ import annotations

from typing import Any

from sglang_asym.runtime.engine_api import BootstrapInfo
from sglang_asym.runtime.http.errors import ApiError
from sglang_asym.runtime.http.runner import new_rid


def per_item(body: dict[str, Any], key: str, n: int, batch: bool) -> list[Any]:
    """`body[key]` spread over n items: a list of n values in a batch, else one value for all."""
    value = body.get(key)
    if batch and isinstance(value, list):
        if len(value) != n:
            raise ApiError.bad_request(f"{key} has {len(value)} entries but the batch has {n} prompts", param=key)
        return list(value)
    return [value] * n


def parse_rids(body: dict[str, Any], n: int, batch: bool) -> list[str]:
    value = body.get("rid")
    if batch and isinstance(value, list):
        rids = per_item(body, "rid", n, batch)
    elif value is None:
        rids = [new_rid() for _ in range(n)]
    elif isinstance(value, str) and value:
        rids = [value] if n == 1 else [f"{value}_{i}" for i in range(n)]  # one rid for a batch: make it distinct
    else:
        rids = [value]
    for rid in rids:
        if not isinstance(rid, str) or not rid:
            raise ApiError.bad_request(f"rid must be a non-empty string, got {rid!r}", param="rid")
    if len(set(rids)) != len(rids):
        raise ApiError.bad_request("rid values in a batch must be distinct", param="rid")
    return rids


def parse_bootstraps(body: dict[str, Any], n: int, batch: bool) -> list[BootstrapInfo | None]:
    hosts = per_item(body, "bootstrap_host", n, batch)
    ports = per_item(body, "bootstrap_port", n, batch)
    rooms = per_item(body, "bootstrap_room", n, batch)
    out: list[BootstrapInfo | None] = []
    for host, port, room in zip(hosts, ports, rooms):
        if room is None and host is None:
            out.append(None)
            continue
        if room is None or host is None:
            missing = "bootstrap_room" if room is None else "bootstrap_host"
            raise ApiError.bad_request(f"{missing} is required together with the other bootstrap fields",
                                       param=missing)
        try:
            out.append(BootstrapInfo(host, port, room))
        except ValueError as exc:
            raise ApiError.bad_request(str(exc), param="bootstrap_room") from exc
    return out
