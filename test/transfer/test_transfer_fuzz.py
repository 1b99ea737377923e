"""Fuzzing every decoder of what crosses between P and D (hypothesis): control messages (any bytes, any fields
under a valid envelope, mutations of every message type), packed slot runs and D's handshake check on P, and
the bootstrap server's answers as the decode side reads them. Each input gives a typed error (ProtocolError,
ValueError, BootstrapError) or a well-formed value, never another exception, a huge allocation or a hang."""

from __future__ import annotations

import dataclasses
import json
import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_transfer_handshake import room as handshake_room
from test_transfer_handshake import request as handshake_request
from test_transfer_messages import ALL

from sglang_asym.transfer import codec
from sglang_asym.transfer.bootstrap_client import BootstrapError, parse_dp_ranks, parse_rank, parse_server_info
from sglang_asym.transfer.errors import ProtocolError
from sglang_asym.transfer.prefill_room import check_request
from sglang_asym.transfer.runs import expand_runs, pack_runs, run_rows, unpack_runs

pytestmark = pytest.mark.timeout(300)
FUZZ = settings(max_examples=300, deadline=2000, derandomize=True)
REGISTERED = tuple(codec._REGISTRY.items())

scalars = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.integers(-3, 3)
           | st.floats() | st.text(max_size=10) | st.binary(max_size=40))
packable = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=16)


def _decodes_or_refuses(data: bytes) -> None:
    try:
        msg = codec.decode(data)
    except ProtocolError as exc:
        assert str(exc)
        return
    assert type(msg) in codec._REGISTRY.values()
    assert codec.decode(codec.encode(msg)) == msg  # anything accepted is a well-formed message


@FUZZ
@given(st.binary(max_size=256))
def test_any_bytes_decode_to_a_message_or_a_protocol_error(data):
    _decodes_or_refuses(data)


@FUZZ
@given(st.sampled_from(REGISTERED), st.data())
def test_any_fields_under_a_valid_envelope(entry, data):
    tag, cls = entry
    names = [f.name for f in dataclasses.fields(cls)]
    fields = data.draw(st.fixed_dictionaries({n: packable for n in names}, optional={"extra": packable})
                       | st.dictionaries(st.sampled_from(names) | st.text(max_size=6), packable, max_size=6)
                       | packable)
    version = data.draw(st.just(codec.PROTOCOL_VERSION) | packable)
    _decodes_or_refuses(msgpack.packb([codec.MAGIC, version, tag, fields], use_bin_type=True))


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, at, value in edits:
        at %= max(len(out), 1)
        if kind == 0 and out:
            out[at] = value
        elif kind == 1:
            out.insert(at, value)
        elif kind == 2 and out:
            del out[at]
        else:
            del out[at:]
    return bytes(out)


@FUZZ
@given(st.sampled_from(ALL), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.integers(0, 255)),
                                      min_size=1, max_size=6))
def test_mutations_of_every_message_type(msg, edits):
    _decodes_or_refuses(_mutate(codec.encode(msg), edits))


@FUZZ
@given(st.binary(max_size=96) | st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1),
                                                   st.integers(-(1 << 63), (1 << 63) - 1)), max_size=4).map(pack_runs))
def test_packed_runs_decode_or_give_a_value_error(data):
    try:
        runs = unpack_runs(data)
        rows = run_rows(runs)
    except ValueError as exc:
        assert str(exc)
        return
    assert rows >= 0 and (runs[:, 0] >= 0).all() and (runs[:, 1] > 0).all()
    if rows <= 1 << 12:  # small enough to expand here: expanding gives exactly that many slots
        assert len(expand_runs(runs)) == rows


@FUZZ
@given(runs=st.binary(max_size=64) | st.lists(st.tuples(st.integers(-4, 1 << 62), st.integers(-4, 1 << 62)),
                                             max_size=4).map(pack_runs),
       capacity=st.integers(-4, 1 << 63), row_bytes=st.sampled_from([288, 292, 0]))
def test_handshake_destinations_are_checked_before_any_expansion(runs, capacity, row_bytes):
    """A run claiming 2^62 rows is refused by its count, not by allocating it."""
    req = handshake_request(runs=runs, capacity_slots=capacity, row_bytes=row_bytes)
    started = time.monotonic()
    try:
        dest = check_request(handshake_room(), req)
    except ValueError as exc:
        assert str(exc).startswith("group 'L20.kv'"), exc
    else:
        assert len(dest["L20.kv"]) == 5 and 0 <= dest["L20.kv"].min() and dest["L20.kv"].max() < capacity
    assert time.monotonic() - started < 1.0


def test_a_run_of_two_to_the_62_rows_is_refused_by_count():
    req = handshake_request(runs=pack_runs([(0, 1 << 62)]), capacity_slots=1 << 62)
    with pytest.raises(ValueError, match=f"decode offers {1 << 62} rows of 288 B, manifest needs 5 rows"):
        check_request(handshake_room(), req)


json_text = st.text(max_size=40) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10).map(json.dumps)
server_infos = st.fixed_dictionaries({k: st.integers(-2, 3) | st.booleans() | st.none() | st.text(max_size=3)
                                      for k in ("attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size")}
                                     ).map(json.dumps)
ranks = st.fixed_dictionaries({"rank_ip": st.text(max_size=12) | st.integers(), "rank_port": st.integers(-2, 70000)
                               | st.floats() | st.text(max_size=5)}).map(json.dumps)
dp_ranks = st.dictionaries(st.text(max_size=6) | st.integers().map(str), st.integers() | st.text(max_size=3)
                           | st.floats(), max_size=4).map(json.dumps)


@FUZZ
@given(text=json_text | server_infos)
def test_server_info_answers_parse_or_give_a_bootstrap_error(text):
    try:
        info = parse_server_info("u", text)
    except BootstrapError as exc:
        assert exc.status == 200 and exc.text
        return
    assert all(type(info[k]) is int and info[k] >= 1 for k in ("attn_tp_size", "attn_cp_size", "dp_size", "pp_size"))


@FUZZ
@given(text=json_text | ranks)
def test_rank_answers_parse_or_give_a_bootstrap_error(text):
    try:
        ip, port = parse_rank("u", text)
    except BootstrapError as exc:
        assert exc.status == 200 and exc.text
        return
    assert isinstance(ip, str) and ip and type(port) is int and 0 < port < 65536


@FUZZ
@given(text=json_text | dp_ranks)
def test_dp_rank_answers_parse_or_give_a_bootstrap_error(text):
    try:
        found = parse_dp_ranks("u", text)
    except BootstrapError as exc:
        assert exc.status == 200 and exc.text
        return
    assert all(type(k) is int and type(v) is int for k, v in found.items())
