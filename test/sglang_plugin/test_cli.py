"""Argument translation and validation on SGLang 0.5.23's real server parser (in-process)."""

import argparse

import pytest

from sglang_asym.sglang_plugin.shared import cli
from sglang_asym.sglang_plugin.shared.cli import extend_parser, find_action, translate
from sglang_asym.sglang_plugin.shared.settings import (CPU_DEFAULT_REQUEST_DEADLINE_S, DEFAULT_REQUEST_DEADLINE_S,
                                                       AsymSettings)
from sglang_asym.sglang_plugin.shared.validation import AsymArgumentError


def parse(parser, *argv):
    return parser.parse_args(list(argv))


@pytest.fixture(autouse=True)
def _gpu_route(monkeypatch):
    """The cases below translate as on a GPU server (the settings record's own defaults); the CPU route's one
    different default, the request deadline, has its own case."""
    monkeypatch.setattr(cli, "cpu_engine_selected", lambda: False)


def test_the_request_deadline_defaults_by_route_and_the_flag_wins(server_parser, v41_checkpoint, monkeypatch):
    prefill = ("--model-path", str(v41_checkpoint), "--disaggregation-mode", "asym-prefill")
    assert translate(parse(server_parser, *prefill)).request_deadline_s == DEFAULT_REQUEST_DEADLINE_S == 120.0
    monkeypatch.setattr(cli, "cpu_engine_selected", lambda: True)  # SGLang's engine on CPU through our platform
    assert translate(parse(server_parser, *prefill)).request_deadline_s == CPU_DEFAULT_REQUEST_DEADLINE_S == 900.0
    given = translate(parse(server_parser, *prefill, "--asym-request-deadline-s", "40"))
    assert given.request_deadline_s == 40.0


def test_asym_prefill_defaults_translate_to_prefill(server_parser, v41_checkpoint):
    args = parse(server_parser, "--model-path", str(v41_checkpoint), "--disaggregation-mode", "asym-prefill")
    assert translate(args) == AsymSettings("asym-prefill", 128, "asym-exact-encoder")
    assert args.disaggregation_mode == "prefill"


def test_asym_decode_with_flags_translates_to_decode(server_parser, v41_checkpoint):
    args = parse(server_parser, "--model-path", str(v41_checkpoint), "--disaggregation-mode", "asym-decode",
                 "--asym-window", "128", "--asym-semantics", "asym", "--disaggregation-transfer-backend", "mooncake_tcp")
    assert translate(args) == AsymSettings("asym-decode", 128, "asym")
    assert args.disaggregation_mode == "decode"
    assert args.disaggregation_transfer_backend == "mooncake_tcp"


@pytest.mark.parametrize("mode", ["null", "prefill", "decode"])
def test_symmetric_modes_are_left_alone(server_parser, llama_checkpoint, mode):
    args = parse(server_parser, "--model-path", str(llama_checkpoint), "--disaggregation-mode", mode,
                 "--disaggregation-transfer-backend", "nixl")
    assert translate(args) is None
    assert args.disaggregation_mode == mode


def test_prefill_side_accepts_decode_only_flags(server_parser, v41_checkpoint):
    args = parse(server_parser, "--model-path", str(v41_checkpoint), "--disaggregation-mode", "asym-prefill",
                 "--disaggregation-decode-enable-radix-cache", "--no-enable-decoder-swa-bounded-replay")
    assert translate(args) == AsymSettings("asym-prefill")


def _error(server_parser, *argv):
    args = parse(server_parser, *argv)
    before = args.disaggregation_mode
    with pytest.raises(AsymArgumentError) as err:
        translate(args)
    assert args.disaggregation_mode == before  # nothing translated on error
    return str(err.value)


def test_asym_flags_without_asym_mode(server_parser, v41_checkpoint):
    ck = str(v41_checkpoint)
    assert _error(server_parser, "--model-path", ck, "--asym-window", "64") == (
        "--asym-window applies only with --disaggregation-mode asym-prefill or asym-decode (got 'null')")
    assert _error(server_parser, "--model-path", ck, "--disaggregation-mode", "decode", "--asym-window", "64",
                  "--asym-semantics", "asym") == (
        "--asym-window and --asym-semantics apply only with --disaggregation-mode asym-prefill or asym-decode "
        "(got 'decode')")


def test_checkpoint_must_be_v41(server_parser, llama_checkpoint, tmp_path):
    assert _error(server_parser, "--model-path", str(llama_checkpoint), "--disaggregation-mode", "asym-prefill") == (
        "--disaggregation-mode asym-prefill serves DeepSeek-V4.1 checkpoints only: "
        f"{llama_checkpoint / 'config.json'}: config.json has model_type 'llama'; sglang-asym serves only "
        "DeepSeek-V4.1 (model_type 'deepseek_v41')")
    missing = tmp_path / "nowhere"
    assert _error(server_parser, "--model-path", str(missing), "--disaggregation-mode", "asym-decode") == (
        f"--disaggregation-mode asym-decode serves DeepSeek-V4.1 checkpoints only: no config.json at {missing}")


@pytest.mark.parametrize(
    "window, message",
    [
        ("200", "--asym-window 200: window W=200 exceeds the model's sliding window 128"),
        ("0", "--asym-window 0: window W must be a positive integer, got 0"),
        ("64", "--asym-window 64: must be the model's sliding_window, 128 (a smaller W is not served)"),
    ],
)
def test_window_must_fit_the_model(server_parser, v41_checkpoint, window, message):
    assert _error(server_parser, "--model-path", str(v41_checkpoint), "--disaggregation-mode", "asym-decode",
                  "--asym-window", window) == message


def test_incompatible_flags(server_parser, v41_checkpoint):
    ck = str(v41_checkpoint)
    assert _error(server_parser, "--model-path", ck, "--disaggregation-mode", "asym-prefill",
                  "--disaggregation-transfer-backend", "nixl") == (
        "--disaggregation-mode asym-prefill transfers its prefix state over Mooncake; "
        "--disaggregation-transfer-backend nixl is not supported")
    assert _error(server_parser, "--model-path", ck, "--disaggregation-mode", "asym-decode",
                  "--enable-pd-role-switch") == (
        "--enable-pd-role-switch cannot be combined with --disaggregation-mode asym-decode: "
        "the asymmetric prefill and decode roles hold different parts of the model")
    assert _error(server_parser, "--model-path", ck, "--disaggregation-mode", "asym-decode",
                  "--disaggregation-decode-enable-radix-cache") == (
        "--disaggregation-decode-enable-radix-cache is not supported with --disaggregation-mode asym-decode yet: "
        "a decode-side prefix hit would move the boundary B = N - W the prefill role computes to")
    assert _error(server_parser, "--model-path", ck, "--disaggregation-mode", "asym-decode",
                  "--no-enable-decoder-swa-bounded-replay") == (
        "--no-enable-decoder-swa-bounded-replay cannot be combined with --disaggregation-mode asym-decode: the "
        "decode role never has the decoder layers' window rows below B = N - W, so those layers must replay from B")


def test_parser_choices_flags_and_idempotence(server_parser, capsys):
    extend_parser(server_parser)  # a second application changes nothing
    mode = find_action(server_parser, "disaggregation_mode")
    assert list(mode.choices) == ["null", "prefill", "decode", "asym-prefill", "asym-decode"]
    window = find_action(server_parser, "asym_window")
    semantics = find_action(server_parser, "asym_semantics")
    assert (window.option_strings, window.default, window.type) == (["--asym-window"], None, int)
    assert (semantics.option_strings, list(semantics.choices)) == (["--asym-semantics"], ["asym-exact-encoder", "asym"])
    with pytest.raises(SystemExit) as exit_info:
        parse(server_parser, "--asym-semantics", "exact")
    assert exit_info.value.code == 2
    assert "argument --asym-semantics: invalid choice: 'exact' (choose from 'asym-exact-encoder', 'asym')" in (
        capsys.readouterr().err)


def test_extend_parser_needs_sglangs_mode_option():
    with pytest.raises(RuntimeError) as err:
        extend_parser(argparse.ArgumentParser())
    assert str(err.value) == (
        "SGLang's server parser has no option with dest 'disaggregation_mode': the pinned SGLang changed")


def test_decode_step_flags(server_parser, v41_checkpoint):
    ck = str(v41_checkpoint)
    args = parse(server_parser, "--model-path", ck, "--disaggregation-mode", "asym-decode", "--asym-token-budget", "96",
                 "--asym-window-chunk", "16")
    settings = translate(args)
    assert settings == AsymSettings("asym-decode", token_budget=96, window_chunk=16)
    assert (settings.chunk_rows, AsymSettings("asym-decode").chunk_rows) == (16, 32)
    whole = translate(parse(server_parser, "--model-path", ck, "--disaggregation-mode", "asym-decode",
                            "--asym-window-chunk", "0"))
    assert whole.chunk_rows is None
    assert _error(server_parser, "--model-path", ck, "--disaggregation-mode", "asym-decode",
                  "--asym-window-chunk", "129") == \
        "--asym-window-chunk must be an integer in [0, window=128], got 129"
    assert _error(server_parser, "--model-path", ck, "--disaggregation-mode", "asym-decode",
                  "--asym-token-budget", "0") == "--asym-token-budget must be a positive integer, got 0"
    assert _error(server_parser, "--model-path", ck, "--asym-token-budget", "64") == (
        "--asym-token-budget applies only with --disaggregation-mode asym-prefill or asym-decode (got 'null')")


def test_transfer_fallback_flag(server_parser, v41_checkpoint):
    ck = str(v41_checkpoint)
    decode = ("--model-path", ck, "--disaggregation-mode", "asym-decode")
    settings = translate(parse(server_parser, *decode, "--asym-transfer-fallback", "recompute"))
    assert settings == AsymSettings("asym-decode", transfer_fallback="recompute")
    assert settings.recomputes_failed_transfers
    assert not translate(parse(server_parser, *decode)).recomputes_failed_transfers  # off by default
    assert _error(server_parser, "--model-path", ck, "--disaggregation-mode", "asym-prefill",
                  "--asym-transfer-fallback", "recompute") == (
        "--asym-transfer-fallback 'recompute' applies to asym-decode only: the prefill role holds no decoder layers")
    assert _error(server_parser, "--model-path", ck, "--disaggregation-mode", "decode",
                  "--asym-transfer-fallback", "off") == (
        "--asym-transfer-fallback applies only with --disaggregation-mode asym-prefill or asym-decode "
        "(got 'decode')")
    with pytest.raises(SystemExit):
        parse(server_parser, *decode, "--asym-transfer-fallback", "retry")
