"""SGLang `sampling_params` -> SamplingParams, with SGLang's key names and strictness.

Keys this runtime implements are mapped; SGLang keys for features it does not implement are accepted
only at their neutral value (e.g. `min_p: 0`, `n: 1`) and otherwise rejected by name; unknown keys are
rejected as SGLang's contract does (`unknown field ...`). Every rejection is an HTTP 400.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from sglang_asym.runtime.engine_api import SamplingParams
from sglang_asym.runtime.http.errors import ApiError

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when the key is absent
TOP_K_DISABLED_FROM = 1 << 30  # SGLang writes "no top-k" as 1 << 30; -1 here

_MAPPED = {  # SGLang key -> SamplingParams field
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "sampling_seed": "seed",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
}
_FRONT_FLAGS = ("skip_special_tokens", "no_stop_trim")  # handled by the detokenizer, not the engine


def _is_empty(v: Any) -> bool:
    return v is None or v == "" or v == [] or v == {}


def _equals(neutral: Any) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if v is None:
            return True
        if isinstance(neutral, bool):
            return v is neutral
        return not isinstance(v, bool) and v == neutral

    return check


def _positive_int(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)


_NEUTRAL: dict[str, Callable[[Any], bool]] = {  # accepted when the predicate holds, 400 otherwise
    "stop": _is_empty,
    "stop_regex": _is_empty,
    "min_p": _equals(0),
    "frequency_penalty": _equals(0),
    "presence_penalty": _equals(0),
    "repetition_penalty": _equals(1),
    "min_new_tokens": _equals(0),
    "n": _equals(1),
    "json_schema": _is_empty,
    "regex": _is_empty,
    "ebnf": _is_empty,
    "structural_tag": _is_empty,
    "spaces_between_special_tokens": _equals(True),
    "stream_interval": _positive_int,
    "logit_bias": _is_empty,
    "custom_params": _is_empty,
    "beam_width": _is_empty,
    "watermark": _is_empty,
    "choice": _is_empty,
}
KNOWN_KEYS = ("max_new_tokens", *_MAPPED, *_FRONT_FLAGS, *_NEUTRAL)


@dataclass(frozen=True)
class ParsedSampling:
    """Sampling settings before the prompt length is known (`max_new_tokens=None` fills the context)."""

    engine_fields: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    where: str = "sampling_params"  # how errors name the source of these settings

    def resolve(self, prompt_len: int, max_context_length: int) -> SamplingParams:
        max_new = self.max_new_tokens
        if max_new is None:
            max_new = max(0, max_context_length - prompt_len)
        return self._build(max_new)

    def check(self) -> None:
        """The range checks that need no prompt, so bad values are reported before tokenizing."""
        self._build(self.max_new_tokens if self.max_new_tokens is not None else 0)

    def _build(self, max_new_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(max_new_tokens=max_new_tokens, **self.engine_fields)
        except ValueError as exc:
            raise ApiError.bad_request(f"{self.where}: {exc}", param=self.where) from exc


def parse_sampling(raw: Any, where: str = "sampling_params") -> ParsedSampling:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ApiError.bad_request(f"{where} must be an object, got {type(raw).__name__}", param=where)
    engine_fields: dict[str, Any] = {}
    flags = {"skip_special_tokens": True, "no_stop_trim": False}
    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
    for key, value in raw.items():
        if key == "max_new_tokens":
            max_new_tokens = value  # None fills the context, as in SGLang
        elif key in _MAPPED:
            if value is not None:
                engine_fields[_MAPPED[key]] = _normalize(key, value)
        elif key in _FRONT_FLAGS:
            if value is not None and not isinstance(value, bool):
                raise ApiError.bad_request(f"{where}.{key} must be a boolean, got {value!r}", param=where)
            if value is not None:
                flags[key] = value
        elif key in _NEUTRAL:
            if not _NEUTRAL[key](value):
                raise ApiError.bad_request(
                    f"{where}.{key}={value!r} is not supported by this runtime (only its default is accepted)",
                    param=where)
        else:
            expected = ", ".join(f"`{k}`" for k in KNOWN_KEYS)
            raise ApiError.bad_request(f"{where}: unknown field `{key}`, expected one of {expected}", param=where)
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool)):
        raise ApiError.bad_request(f"{where}.max_new_tokens must be an integer, got {max_new_tokens!r}", param=where)
    parsed = ParsedSampling(engine_fields, max_new_tokens, flags["skip_special_tokens"], flags["no_stop_trim"], where)
    parsed.check()
    return parsed


def _normalize(key: str, value: Any) -> Any:
    if key == "top_k" and isinstance(value, int) and not isinstance(value, bool) and value >= TOP_K_DISABLED_FROM:
        return -1
    if key == "stop_token_ids" and isinstance(value, list):
        return tuple(value)
    return value
