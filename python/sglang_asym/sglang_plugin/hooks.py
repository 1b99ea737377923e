"""The SGLang symbols the plugin hooks, and what each hook does.

  ServerArgs.add_cli_args   AFTER   add the asymmetric modes and --asym-* flags (so --help lists them)
  ServerArgs.from_cli_args  AROUND  validate + translate asym-* to prefill/decode, attach AsymSettings
  prepare_server_args       AROUND  argument errors as argparse-style exits; CPU servers hand over
                                    to the embedded runtime

`prepare_server_args` is what both `python -m sglang.launch_server` and `sglang serve` call after
`load_plugins()`; HookRegistry also rebinds the stale `from ... import prepare_server_args` copy
that `sglang.launch_server` (run as __main__) holds.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from . import cpu_handover
from .cli import extend_parser, translate
from .settings import attach
from .validation import AsymArgumentError

SERVER_ARGS = "sglang.srt.server_args"
ADD_CLI_ARGS = f"{SERVER_ARGS}.ServerArgs.add_cli_args"
FROM_CLI_ARGS = f"{SERVER_ARGS}.ServerArgs.from_cli_args"
PREPARE_SERVER_ARGS = f"{SERVER_ARGS}.prepare_server_args"


def after_add_cli_args(result: Any, parser: Any) -> None:
    extend_parser(parser)


def around_from_cli_args(original: Callable, cls: type, args: Any) -> Any:
    settings = translate(args)
    server_args = original(cls, args)
    if settings is not None:
        attach(server_args, settings)
    return server_args


def around_prepare_server_args(original: Callable, argv: list[str]) -> Any:
    try:
        server_args = original(argv)
    except AsymArgumentError as exc:
        # Same shape and status as argparse's own usage errors.
        sys.stderr.write(f"sglang-asym: error: {exc}\n")
        raise SystemExit(2) from None
    if cpu_handover.should_hand_over(server_args):
        try:
            cpu_handover.hand_over(argv)
        except cpu_handover.CpuHandoverError as exc:
            sys.stderr.write(f"sglang-asym: error: {exc}\n")
            raise SystemExit(1) from None
    return server_args


def hook_table() -> tuple[tuple[str, Callable, str], ...]:
    """(target, hook, HookType name) for every hook; the canary tests check each target."""
    return (
        (ADD_CLI_ARGS, after_add_cli_args, "AFTER"),
        (FROM_CLI_ARGS, around_from_cli_args, "AROUND"),
        (PREPARE_SERVER_ARGS, around_prepare_server_args, "AROUND"),
    )


def register_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, hook_type in hook_table():
        HookRegistry.register(target, hook, HookType[hook_type])
