"""The command line of an asymmetric SGLang server: two more `--disaggregation-mode` choices, six
flags, and their translation to SGLang's own prefill/decode modes.

`extend_parser` runs after `ServerArgs.add_cli_args` (so `--help` lists everything);
`translate` runs on the parsed namespace before `ServerArgs.from_cli_args` builds the record.
"""

from __future__ import annotations

import argparse

from ...sched.config import DEFAULT_WINDOW_CHUNK
from ..cpu_platform.engine_mode import cpu_engine_selected
from .settings import (
    ASYM_MODES,
    CPU_DEFAULT_REQUEST_DEADLINE_S,
    DEFAULT_REQUEST_DEADLINE_S,
    DEFAULT_SEMANTICS,
    DEFAULT_TOKEN_BUDGET,
    DEFAULT_WINDOW,
    SEMANTICS_CHOICES,
    TRANSFER_FALLBACKS,
    AsymSettings,
)
from .validation import AsymArgumentError, validate_asym_args

MODE_DEST = "disaggregation_mode"
MODE_HELP = (
    "sglang-asym: 'asym-prefill' runs the encoder part of DeepSeek-V4.1 over the prompt's first"
    " N - W tokens and ships the prefix state; 'asym-decode' computes the last W prompt tokens"
    " through the full model on top of it, then decodes."
)


def find_action(parser: argparse.ArgumentParser, dest: str) -> argparse.Action:
    for action in parser._actions:  # argparse keeps no public index by dest
        if action.dest == dest:
            return action
    raise RuntimeError(f"SGLang's server parser has no option with dest {dest!r}: the pinned SGLang changed")


def extend_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the asymmetric modes and flags to SGLang's server parser. Idempotent."""
    if "--asym-window" in parser._option_string_actions:
        return
    mode = find_action(parser, MODE_DEST)
    if mode.choices is None:
        raise RuntimeError("--disaggregation-mode has no choices list: the pinned SGLang changed")
    mode.choices = [*mode.choices, *ASYM_MODES]
    mode.help = f"{(mode.help or '').rstrip('. ')}. {MODE_HELP}"
    group = parser.add_argument_group("sglang-asym (asymmetric prefill/decode for DeepSeek-V4.1)")
    # Defaults stay None so that a flag given without an asymmetric mode can be refused.
    group.add_argument(
        "--asym-window",
        type=int,
        default=None,
        metavar="W",
        help=f"Prompt tokens the decode worker computes itself, B = N - W (default {DEFAULT_WINDOW}).",
    )
    group.add_argument(
        "--asym-semantics",
        choices=SEMANTICS_CHOICES,
        default=None,
        help="'asym-exact-encoder' also ships the encoder layers' window rows [B-W+1, B) and equals "
        "SGLang's decoder-side bounded replay; 'asym' floors every layer's window at B "
        f"(default {DEFAULT_SEMANTICS}).",
    )
    group.add_argument(
        "--asym-token-budget",
        type=int,
        default=None,
        metavar="ROWS",
        help="asym-decode: decode rows + window rows per scheduler step; a window is cut to what is left "
        f"beside the running requests' decode rows (default {DEFAULT_TOKEN_BUDGET}).",
    )
    group.add_argument(
        "--asym-window-chunk",
        type=int,
        default=None,
        metavar="ROWS",
        help="asym-decode: at most this many window rows per request and step, so a new request's window "
        f"runs over several steps beside the decoding ones (default min({DEFAULT_WINDOW_CHUNK}, W); 0: whole "
        "windows).",
    )
    group.add_argument(
        "--asym-transfer-fallback",
        choices=TRANSFER_FALLBACKS,
        default=None,
        help="asym-decode: what a request gets when its prefix transfer or handshake fails: 'off' (an "
        "error, the default) or 'recompute' (this worker computes the prefix with its full model).",
    )
    group.add_argument(
        "--asym-request-deadline-s",
        type=float,
        default=None,
        metavar="SECONDS",
        help="Every admitted request ends within this many seconds on each worker of the pair: past it, it is "
        "aborted (its pool slots freed) and the client gets a 503; the PD bootstrap and transfer waits get the "
        f"same bound (default {DEFAULT_REQUEST_DEADLINE_S:g}; {CPU_DEFAULT_REQUEST_DEADLINE_S:g} on the CPU route).",
    )


def default_request_deadline_s() -> float:
    """The lifetime bound of a request when --asym-request-deadline-s is not given: longer on the CPU route."""
    return CPU_DEFAULT_REQUEST_DEADLINE_S if cpu_engine_selected() else DEFAULT_REQUEST_DEADLINE_S


def translate(args: argparse.Namespace) -> AsymSettings | None:
    """Validates an asymmetric mode and rewrites `args.disaggregation_mode` to SGLang's prefill or
    decode. Returns the settings, or None for a symmetric server (args left untouched)."""
    mode = getattr(args, MODE_DEST)
    window = getattr(args, "asym_window", None)
    semantics = getattr(args, "asym_semantics", None)
    budget = getattr(args, "asym_token_budget", None)
    chunk = getattr(args, "asym_window_chunk", None)
    fallback = getattr(args, "asym_transfer_fallback", None)
    deadline = getattr(args, "asym_request_deadline_s", None)
    if mode not in ASYM_MODES:
        given = [flag for flag, value in (("--asym-window", window), ("--asym-semantics", semantics),
                                          ("--asym-token-budget", budget), ("--asym-window-chunk", chunk),
                                          ("--asym-transfer-fallback", fallback),
                                          ("--asym-request-deadline-s", deadline))
                 if value is not None]
        if given:
            verb = "apply" if len(given) > 1 else "applies"
            raise AsymArgumentError(
                f"{' and '.join(given)} {verb} only with --disaggregation-mode asym-prefill or asym-decode "
                f"(got {mode!r})"
            )
        return None
    window = DEFAULT_WINDOW if window is None else window
    semantics = DEFAULT_SEMANTICS if semantics is None else semantics
    validate_asym_args(args, mode, window, semantics)
    try:
        settings = AsymSettings(mode=mode, window=window, semantics=semantics,
                                token_budget=DEFAULT_TOKEN_BUDGET if budget is None else budget, window_chunk=chunk,
                                transfer_fallback="off" if fallback is None else fallback,
                                request_deadline_s=default_request_deadline_s() if deadline is None else deadline)
    except ValueError as exc:  # a value out of range, said in the settings' own words
        raise AsymArgumentError(str(exc).replace("AsymSettings.token_budget", "--asym-token-budget")
                                .replace("AsymSettings.window_chunk", "--asym-window-chunk")
                                .replace("AsymSettings.transfer_fallback", "--asym-transfer-fallback")
                                .replace("AsymSettings.request_deadline_s", "--asym-request-deadline-s")) from None
    setattr(args, MODE_DEST, settings.sglang_mode)
    return settings
