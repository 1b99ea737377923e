"""The CPU hand-over decision and the prepare_server_args hook, driven without patching SGLang: SGLang's
own engine serves every mode on CPU; with SGLANG_ASYM_CPU_RUNTIME=embedded the asymmetric modes hand
over to the embedded runtime."""

from types import SimpleNamespace

import pytest
import torch

from sglang_asym.sglang_plugin import cpu_handover, hooks
from sglang_asym.sglang_plugin.settings import AsymSettings, attach
from sglang_asym.sglang_plugin.validation import AsymArgumentError


def record(device, model_path, settings=None):
    server_args = SimpleNamespace(device=device, model_path=str(model_path))
    if settings is not None:
        attach(server_args, settings)
    return server_args


def test_runs_on_cpu():
    assert cpu_handover.runs_on_cpu("cpu") is True
    assert cpu_handover.runs_on_cpu("cuda") is False
    assert cpu_handover.runs_on_cpu("cuda:1") is False
    assert cpu_handover.runs_on_cpu(None) is (not torch.cuda.is_available())


def test_by_default_no_server_hands_over(v41_checkpoint, monkeypatch):
    monkeypatch.delenv(cpu_handover.RUNTIME_ENV, raising=False)
    assert cpu_handover.should_hand_over(record("cpu", v41_checkpoint, AsymSettings("asym-prefill"))) is False
    assert cpu_handover.should_hand_over(record("cpu", v41_checkpoint, AsymSettings("asym-decode"))) is False
    monkeypatch.setenv(cpu_handover.RUNTIME_ENV, "sglang")
    assert cpu_handover.should_hand_over(record("cpu", v41_checkpoint, AsymSettings("asym-decode"))) is False


def test_which_servers_hand_over_when_the_embedded_runtime_is_asked_for(v41_checkpoint, llama_checkpoint,
                                                                        monkeypatch):
    monkeypatch.setenv(cpu_handover.RUNTIME_ENV, "embedded")
    asym = AsymSettings("asym-prefill")
    assert cpu_handover.should_hand_over(record("cpu", v41_checkpoint, asym)) is True
    assert cpu_handover.should_hand_over(record("cpu", v41_checkpoint)) is False  # SGLang's engine on CPU
    assert cpu_handover.should_hand_over(record("cpu", llama_checkpoint)) is False
    assert cpu_handover.should_hand_over(record("cuda", v41_checkpoint, asym)) is False
    assert cpu_handover.is_v41_checkpoint(None) is False


def test_hand_over_passes_argv_and_exits_with_the_runtime_status():
    calls = []

    def launcher(argv):
        calls.append(argv)
        return 3

    argv = ("--model-path", "/m", "--device", "cpu")
    with pytest.raises(SystemExit) as exit_info:
        cpu_handover.hand_over(argv, launch=launcher)
    assert exit_info.value.code == 3
    assert calls == [list(argv)]


def test_missing_launcher_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(cpu_handover, "LAUNCHER_MODULE", "sglang_asym.no_such_launcher")
    with pytest.raises(cpu_handover.CpuHandoverError) as err:
        cpu_handover.hand_over(["--device", "cpu"])
    assert str(err.value) == ("this server runs on CPU and hands over to sglang-asym's embedded runtime, "
                              "but sglang_asym.no_such_launcher is not installed")


def test_prepare_hook_turns_argument_errors_into_usage_exits(capsys):
    def original(argv):
        raise AsymArgumentError("--asym-window 0: bad")

    with pytest.raises(SystemExit) as exit_info:
        hooks.around_prepare_server_args(original, ["--asym-window", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "sglang-asym: error: --asym-window 0: bad\n"


def test_prepare_hook_hands_cpu_servers_over(monkeypatch, v41_checkpoint, llama_checkpoint):
    monkeypatch.setenv(cpu_handover.RUNTIME_ENV, "embedded")
    handed = []
    monkeypatch.setattr(cpu_handover, "hand_over", lambda argv: handed.append(argv))
    gpu = record("cuda", v41_checkpoint, AsymSettings("asym-decode"))
    assert hooks.around_prepare_server_args(lambda argv: gpu, ["a"]) is gpu
    other = record("cpu", llama_checkpoint)
    assert hooks.around_prepare_server_args(lambda argv: other, ["b"]) is other
    symmetric = record("cpu", v41_checkpoint)
    assert hooks.around_prepare_server_args(lambda argv: symmetric, ["e"]) is symmetric
    assert handed == []
    hooks.around_prepare_server_args(lambda argv: record("cpu", v41_checkpoint, AsymSettings("asym-prefill")),
                                     ["c", "d"])
    assert handed == [["c", "d"]]


def test_prepare_hook_reports_a_missing_runtime(monkeypatch, capsys, v41_checkpoint):
    monkeypatch.setenv(cpu_handover.RUNTIME_ENV, "embedded")
    monkeypatch.setattr(cpu_handover, "LAUNCHER_MODULE", "sglang_asym.no_such_launcher")
    with pytest.raises(SystemExit) as exit_info:
        hooks.around_prepare_server_args(lambda argv: record("cpu", v41_checkpoint, AsymSettings("asym-decode")), [])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "sglang-asym: error: this server runs on CPU and hands over to sglang-asym's embedded runtime, "
        "but sglang_asym.no_such_launcher is not installed\n")
