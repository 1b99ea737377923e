"""Control messages: exact round trips, and clear errors for anything malformed."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from transfer_cases import COMPAT

from sglang_asym.manifest import PayloadManifest, RowGroup
from sglang_asym.transfer import codec
from sglang_asym.transfer.checksum import GroupChecksum
from sglang_asym.transfer.errors import ProtocolError
from sglang_asym.transfer.messages import (DecodeAbort, GroupDestination, Ping, Pong, PrefillFailed,
                                           TransferAccept, TransferComplete, TransferReject, TransferRequest,
                                           TransferVerdict, check_room)

MANIFEST = PayloadManifest((RowGroup("L20.kv", 288, 5), RowGroup("tails", 4096, 0)))
REQUEST = TransferRequest(
    room=(1 << 63) - 1, decode_endpoint="tcp://127.0.0.1:5000", decode_session="127.0.0.1:16000",
    compat=COMPAT, manifest=MANIFEST,
    destinations=(GroupDestination.for_slots("L20.kv", (1 << 64) - 4096, 8192, 288, np.array([7, 8, 9, 100, 101])),
                  GroupDestination.for_slots("tails", 4096, 64, 4096, np.array([], dtype=np.int64))))
LANDING_REQUEST = TransferRequest(
    room=7, decode_endpoint="tcp://127.0.0.1:5000", decode_session="127.0.0.1:16000", compat=COMPAT,
    manifest=MANIFEST, destinations=(), landing=(1 << 64) - 4096)
ALL = [REQUEST, LANDING_REQUEST, TransferAccept(1, "tcp://127.0.0.1:1", COMPAT), TransferReject(2, "no"),
       TransferComplete(3, (GroupChecksum("L20.kv", 5, 0xFFFFFFFF), GroupChecksum("tails", 0, 0))),
       TransferVerdict(4, True, ""), PrefillFailed(5, "x", writes_stopped=False),
       DecodeAbort(6, "cancelled", "tcp://127.0.0.1:2"), Ping("tcp://127.0.0.1:2"), Pong("tcp://127.0.0.1:1")]


@pytest.mark.parametrize("msg", ALL, ids=lambda m: type(m).__name__)
def test_round_trip_is_exact(msg) -> None:
    data = codec.encode(msg)
    assert msgpack.unpackb(data)[:3] == ["sgla", 3, type(msg).TAG]
    back = codec.decode(data)
    assert back == msg and type(back) is type(msg)


def test_every_message_type_is_covered() -> None:
    assert {type(m).TAG for m in ALL} == set(codec._REGISTRY)


def envelope(version=codec.PROTOCOL_VERSION, tag="transfer_verdict", fields=None) -> bytes:
    return msgpack.packb(["sgla", version, tag, fields if fields is not None else
                          {"room": 1, "ok": True, "reason": ""}])


@pytest.mark.parametrize("data, message", [
    (envelope(version=1), "unsupported control protocol version 1 (this side speaks 3)"),
    (envelope(tag="transfer_teleport"), "unknown control message type 'transfer_teleport'"),
    (b"\xc1", "control message is not valid msgpack"),
    (msgpack.packb(["zmq", 1, "ping", {}]), "lacks the sglang-asym envelope"),
    (msgpack.packb({"room": 1}), "lacks the sglang-asym envelope"),
    (envelope(fields={"room": 1, "ok": True}), "transfer_verdict: fields do not match TransferVerdict "
                                               "(missing ['reason'], unexpected [])"),
    (envelope(fields={"room": 1, "ok": True, "reason": "", "x": 0}), "unexpected ['x']"),
    (envelope(fields={"room": True, "ok": True, "reason": ""}), "transfer_verdict.room: expected int, got bool"),
    (envelope(fields={"room": 1, "ok": 1, "reason": ""}), "transfer_verdict.ok: expected bool, got int"),
    (envelope(fields={"room": "1", "ok": True, "reason": ""}), "transfer_verdict.room: expected int, got str"),
])
def test_malformed_input_is_a_clear_protocol_error(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        codec.decode(data)


def test_nested_fields_are_validated() -> None:
    wire = msgpack.unpackb(codec.encode(REQUEST))
    wire[3]["manifest"]["groups"][0]["num_rows"] = -1
    with pytest.raises(ProtocolError, match=r"transfer_request.manifest.groups\[0\]: invalid RowGroup: "
                                            r"RowGroup 'L20.kv': num_rows must be >= 0, got -1"):
        codec.decode(msgpack.packb(wire))
    wire = msgpack.unpackb(codec.encode(REQUEST))
    wire[3]["destinations"][0]["runs"] = [[7, 3]]
    with pytest.raises(ProtocolError, match=r"transfer_request.destinations\[0\].runs: expected bytes, got list"):
        codec.decode(msgpack.packb(wire))
    wire = msgpack.unpackb(codec.encode(REQUEST))
    wire[3]["destinations"][0]["capacity_slots"] = [1]
    with pytest.raises(ProtocolError, match=r"transfer_request.destinations\[0\].capacity_slots: expected int"):
        codec.decode(msgpack.packb(wire))
    wire = msgpack.unpackb(codec.encode(REQUEST))
    wire[3]["compat"]["semantics"] = "magic"
    with pytest.raises(ProtocolError, match="transfer_request.compat: invalid TransferCompat: "
                                            "TransferCompat.semantics must be one of"):
        codec.decode(msgpack.packb(wire))


def test_only_registered_frozen_dataclasses_are_messages() -> None:
    @dataclasses.dataclass(frozen=True)
    class Loose:
        x: int

    with pytest.raises(TypeError, match="Loose is not a registered message"):
        codec.encode(Loose(1))
    with pytest.raises(TypeError, match="must be a frozen dataclass"):
        codec.message("mutable")(dataclasses.dataclass(type("Mutable", (), {"__annotations__": {"x": int}})))
    with pytest.raises(TypeError, match="message tag 'ping' registered twice"):
        codec.message("ping")(dataclasses.dataclass(frozen=True)(type("Ping2", (), {"__annotations__": {}})))


def test_destination_runs_round_trip() -> None:
    assert REQUEST.destinations[0].slots().tolist() == [7, 8, 9, 100, 101]
    assert codec.decode(codec.encode(REQUEST)).destinations[0].slots().tolist() == [7, 8, 9, 100, 101]
    assert REQUEST.destinations[1].slots().tolist() == []


def test_tuple_items_are_checked_with_their_path() -> None:
    wire = msgpack.unpackb(codec.encode(REQUEST))
    wire[3]["compat"]["row_formats"][2]["row_bytes"] = "288"
    with pytest.raises(ProtocolError,
                       match=r"transfer_request.compat.row_formats\[2\].row_bytes: expected int, got str"):
        codec.decode(msgpack.packb(wire))


@pytest.mark.parametrize("room", [-1, 1 << 63, True, 1.0, "5"])
def test_room_range(room) -> None:
    with pytest.raises(ValueError, match=r"bootstrap_room must be an int in \[0, 2\^63\)"):
        check_room(room)
    assert check_room(0) == 0 and check_room((1 << 63) - 1) == (1 << 63) - 1


def test_remembered_values_come_back_as_themselves_for_their_exact_wire_form_only() -> None:
    manifest = PayloadManifest((RowGroup("L20.kv", 288, 11), RowGroup("tails", 4096, 1)))
    codec.remember(manifest)
    request = dataclasses.replace(REQUEST, manifest=manifest)
    assert codec.decode(codec.encode(request)).manifest is manifest
    other = PayloadManifest((RowGroup("L20.kv", 288, 12), RowGroup("tails", 4096, 1)))
    back = codec.decode(codec.encode(dataclasses.replace(REQUEST, manifest=other))).manifest
    assert back == other and back is not other  # not remembered: decoded and validated field by field
    wire = msgpack.unpackb(codec.encode(request))
    wire[3]["manifest"]["groups"][0]["num_rows"] = 11.0  # equal in Python, not on the wire: still strict
    with pytest.raises(ProtocolError, match=r"transfer_request.manifest.groups\[0\].num_rows: expected int, got float"):
        codec.decode(msgpack.packb(wire))
    with pytest.raises(TypeError, match="dict is not a frozen dataclass"):
        codec.remember({"groups": []})


def test_remembered_values_per_type_are_bounded() -> None:
    manifests = [PayloadManifest((RowGroup("g", 4, n),)) for n in range(1, codec.MAX_KNOWN_PER_TYPE + 2)]
    for m in manifests:
        codec.remember(m)
    decoded = [codec.decode(codec.encode(dataclasses.replace(REQUEST, manifest=m))).manifest for m in manifests]
    assert decoded == manifests
    assert decoded[0] is not manifests[0] and all(d is m for d, m in zip(decoded[1:], manifests[1:]))
