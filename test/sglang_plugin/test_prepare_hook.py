"""The prepare_server_args hook, driven without patching SGLang: argument errors become argparse-style
usage exits; a valid command line passes through unchanged."""

from types import SimpleNamespace

import pytest

from sglang_asym.sglang_plugin import hooks
from sglang_asym.sglang_plugin.shared.validation import AsymArgumentError


def test_prepare_hook_turns_argument_errors_into_usage_exits(capsys):
    def original(argv):
        raise AsymArgumentError("--asym-window 0: bad")

    with pytest.raises(SystemExit) as exit_info:
        hooks.around_prepare_server_args(original, ["--asym-window", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "sglang-asym: error: --asym-window 0: bad\n"


def test_prepare_hook_returns_the_parsed_server_unchanged(capsys):
    parsed = SimpleNamespace(device="cpu", model_path="/m")
    seen = []
    assert hooks.around_prepare_server_args(lambda argv: seen.append(argv) or parsed, ["a", "b"]) is parsed
    assert seen == [["a", "b"]]
    assert capsys.readouterr().err == ""
