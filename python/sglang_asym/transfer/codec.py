"""Typed, versioned msgpack encoding of frozen dataclass messages.

Wire form of one message: msgpack array `[MAGIC, version, type_tag, {field: value}]`.
Nested frozen dataclasses become maps, tuples become arrays. Decoding rebuilds the exact
dataclass types from their annotations and rejects anything else with a `ProtocolError`
that names the message type and the field. Values a worker holds and expects back (`remember`)
decode by one lookup of their packed bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import types
import typing
from typing import Any, Callable

import msgpack

from sglang_asym.transfer.errors import ProtocolError

MAGIC = "sgla"
PROTOCOL_VERSION = 3  # 2: completions carry CRC32C (field crc32c) instead of zlib CRC32; 3: handshakes may offer a landing extent

_REGISTRY: dict[str, type] = {}
MAX_KNOWN_PER_TYPE = 64
_known: dict[type, dict[bytes, Any]] = {}   # per type: packed wire form -> the value (replaced whole, never mutated)
_known_lock = threading.Lock()


def message(tag: str):
    """Class decorator: register a frozen dataclass as a wire message under `tag`."""

    def register(cls: type) -> type:
        if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:
            raise TypeError(f"{cls.__name__} must be a frozen dataclass")
        if tag in _REGISTRY:
            raise TypeError(f"message tag {tag!r} registered twice")
        _REGISTRY[tag] = cls
        cls.TAG = tag
        return cls

    return register


def encode(msg: Any) -> bytes:
    tag = getattr(type(msg), "TAG", None)
    if tag is None or _REGISTRY.get(tag) is not type(msg):
        raise TypeError(f"{type(msg).__name__} is not a registered message")
    return msgpack.packb([MAGIC, PROTOCOL_VERSION, tag, _to_wire(msg)], use_bin_type=True)


def decode(data: bytes) -> Any:
    try:
        envelope = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"control message is not valid msgpack: {exc}") from exc
    if not isinstance(envelope, list) or len(envelope) != 4 or envelope[0] != MAGIC:
        raise ProtocolError("control message lacks the sglang-asym envelope [magic, version, type, fields]")
    _, version, tag, fields = envelope
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported control protocol version {version!r} (this side speaks {PROTOCOL_VERSION})")
    cls = _REGISTRY.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ProtocolError(f"unknown control message type {tag!r}")
    return _from_wire(cls, fields, tag)


def remember(value: Any) -> None:
    """Let decoding return `value` itself wherever a nested value of its type arrives with exactly
    its wire form (compared as packed msgpack bytes, so True vs 1 or str vs bytes never match).
    For values a worker already holds and expects back (its compat, a room's manifest): a
    handshake then skips rebuilding and re-validating them, which is most of its decoding and
    sits on the transfer's critical path. Up to MAX_KNOWN_PER_TYPE values per type, the newest."""
    tp = type(value)
    if not dataclasses.is_dataclass(tp) or not tp.__dataclass_params__.frozen:
        raise TypeError(f"{tp.__name__} is not a frozen dataclass")
    packed = msgpack.packb(_to_wire(value), use_bin_type=True)
    with _known_lock:
        table = {k: v for k, v in _known.get(tp, {}).items() if k != packed}
        table[packed] = value
        while len(table) > MAX_KNOWN_PER_TYPE:
            del table[next(iter(table))]
        _known[tp] = table  # readers see the old or the new table, never a half-built one


def _to_wire(value: Any) -> Any:
    names = _field_names(type(value))
    if names is not None:
        return {n: _to_wire(getattr(value, n)) for n in names}
    if isinstance(value, tuple):
        return [_to_wire(v) for v in value]
    return value


@functools.cache
def _field_names(tp: type) -> tuple[str, ...] | None:
    """Field names of a dataclass type (None for anything else), looked up once per type."""
    return tuple(f.name for f in dataclasses.fields(tp)) if dataclasses.is_dataclass(tp) else None


def _from_wire(tp: Any, value: Any, path: str) -> Any:
    return _decoder(tp)(value, path)


@functools.cache
def _decoder(tp: Any) -> Callable[[Any, str], Any]:
    """A decoding function for type `tp`, built once per type (messages carry thousands of runs)."""
    if dataclasses.is_dataclass(tp):
        return _dataclass_decoder(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _decoder(args[0])

        def decode_homogeneous(value: Any, path: str) -> tuple:
            if type(value) is not list:
                raise ProtocolError(f"{path}: expected an array, got {type(value).__name__}")
            try:  # item paths are only formatted when something is wrong
                return tuple([item(v, path) for v in value])
            except ProtocolError:
                for i, v in enumerate(value):
                    item(v, f"{path}[{i}]")
                raise

        return decode_homogeneous
    if origin is tuple:
        items = [_decoder(a) for a in args]

        exact = tuple(a for a in args if a in (int, str, bytes, bool)) == args  # fast path: plain scalars

        def decode_fixed(value: Any, path: str) -> tuple:
            if type(value) is not list:
                raise ProtocolError(f"{path}: expected an array, got {type(value).__name__}")
            if len(value) != len(items):
                raise ProtocolError(f"{path}: expected {len(items)} items, got {len(value)}")
            if exact and all(type(v) is a for v, a in zip(value, args)):
                return tuple(value)
            return tuple(d(v, f"{path}[{i}]") for i, (d, v) in enumerate(zip(items, value)))

        return decode_fixed
    if origin in (typing.Union, types.UnionType):
        options = [_decoder(a) for a in args]

        def decode_union(value: Any, path: str) -> Any:
            for option in options:
                try:
                    return option(value, path)
                except ProtocolError:
                    continue
            raise ProtocolError(f"{path}: {value!r} matches none of {tp}")

        return decode_union
    if tp is type(None) or tp in (int, float, str, bool, bytes):
        return _scalar_decoder(tp)
    raise TypeError(f"no wire decoding for type {tp!r}")


def _scalar_decoder(tp: type) -> Callable[[Any, str], Any]:
    expected = type(None) if tp is type(None) else tp
    name = "nil" if tp is type(None) else tp.__name__

    def decode_scalar(value: Any, path: str) -> Any:
        # Exact type match: bool is an int subclass, so True never passes for an int field.
        if type(value) is expected:
            return value
        if tp is float and type(value) is int:
            return float(value)
        raise ProtocolError(f"{path}: expected {name}, got {type(value).__name__}")

    return decode_scalar


def _dataclass_decoder(cls: type) -> Callable[[Any, str], Any]:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    name_set = frozenset(names)
    fields = [(n, _decoder(hints[n])) for n in names]

    def decode_dataclass(value: Any, path: str) -> Any:
        if type(value) is not dict:
            raise ProtocolError(f"{path}: expected a map for {cls.__name__}, got {type(value).__name__}")
        known = _known.get(cls)
        if known:
            hit = known.get(msgpack.packb(value, use_bin_type=True))
            if hit is not None:
                return hit
        if value.keys() != name_set:
            missing = sorted(name_set - value.keys())
            extra = sorted(map(str, value.keys() - name_set))
            raise ProtocolError(f"{path}: fields do not match {cls.__name__} (missing {missing}, unexpected {extra})")
        try:  # field paths are only formatted when something is wrong (a handshake has ~150 fields)
            kwargs = {n: d(value[n], path) for n, d in fields}
        except ProtocolError:
            for n, d in fields:
                d(value[n], f"{path}.{n}")
            raise
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"{path}: invalid {cls.__name__}: {exc}") from exc

    return decode_dataclass
