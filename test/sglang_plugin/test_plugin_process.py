"""The plugin as SGLang loads it: through its entry point, each run in a process of its own."""

import json

import pytest

from .conftest import REPO, run_python

ASYM_TARGETS = [
    "sglang.srt.server_args.ServerArgs.add_cli_args",
    "sglang.srt.server_args.ServerArgs.from_cli_args",
    "sglang.srt.server_args.prepare_server_args",
    "sglang.srt.runtime_context.publish",
]
# On a machine without CUDA the plugin also selects SGLang's engine on CPU: its launcher patches
# (cpu_patches.py) are registered with the plugin's hooks and applied by load_plugins
CPU_LAUNCHER_TARGETS = [
    "sglang.srt.entrypoints.openai.chat_encoding.resolve_chat_encoding_spec",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
    "sglang.srt.arg_groups.speculative_hook._handle_dspark",
]


@pytest.fixture(scope="module")
def driver_report(v41_checkpoint, llama_checkpoint):
    done = run_python([str(REPO / "test/sglang_plugin/plugin_driver.py"), str(v41_checkpoint), str(llama_checkpoint)])
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


def test_entry_point_registers_and_applies_every_hook(driver_report):
    assert driver_report["hooks"] == {
        ASYM_TARGETS[0]: [["AFTER", "sglang_asym", "sglang-asym"]],
        ASYM_TARGETS[1]: [["AROUND", "sglang_asym", "sglang-asym"]],
        ASYM_TARGETS[2]: [["AROUND", "sglang_asym", "sglang-asym"]],
        ASYM_TARGETS[3]: [["AFTER", "sglang_asym", "sglang-asym"]],
        CPU_LAUNCHER_TARGETS[0]: [["AROUND", "sglang_asym", "sglang-asym"]],
        CPU_LAUNCHER_TARGETS[1]: [["AROUND", "sglang_asym", "sglang-asym"]],
        CPU_LAUNCHER_TARGETS[2]: [["AROUND", "sglang_asym", "sglang-asym"]],
    }
    assert driver_report["patched"] == sorted(ASYM_TARGETS + CPU_LAUNCHER_TARGETS)


def test_translation_through_prepare_server_args(driver_report):
    cases = driver_report["cases"]
    assert cases[0] == {"argv": cases[0]["argv"], "mode": "prefill", "device": "cuda",
                        "settings": ["asym-prefill", 128, "asym-exact-encoder"]}
    assert cases[1] == {"argv": cases[1]["argv"], "mode": "decode", "device": "cuda",
                        "settings": ["asym-decode", 128, "asym"]}
    assert cases[2] == {"argv": cases[2]["argv"], "mode": "decode", "device": "cuda", "settings": None}
    assert cases[3] == {"argv": cases[3]["argv"], "exit": 2, "stderr": (
        "sglang-asym: error: --disaggregation-mode asym-prefill transfers its prefix state over Mooncake; "
        "--disaggregation-transfer-backend nixl is not supported\n")}
    # CPU: every V4.1 server, asymmetric or not, is served by SGLang's own engine (the CPU platform), as
    # every other model is.
    assert cases[4] == {"argv": cases[4]["argv"], "mode": "decode", "device": "cpu",
                        "settings": ["asym-decode", 128, "asym-exact-encoder"]}
    assert cases[5] == {"argv": cases[5]["argv"], "mode": "null", "device": "cpu", "settings": None}
    assert cases[6] == {"argv": cases[6]["argv"], "mode": "null", "device": "cpu", "settings": None}
    assert len(cases) == 7


def test_launch_server_help_lists_the_asymmetric_modes():
    done = run_python(["-m", "sglang.launch_server", "--help"])
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "[--disaggregation-mode {null,prefill,decode,asym-prefill,asym-decode}]" in out
    assert "[--asym-window W]" in out
    assert "[--asym-semantics {asym-exact-encoder,asym}]" in out
    flat = " ".join(out.split())
    assert "Prompt tokens the decode worker computes itself, B = N - W (default 128)." in flat
    assert "window at B (default asym-exact-encoder)." in flat


def test_launch_server_reports_argument_errors_like_argparse(tmp_path):
    # python -m sglang.launch_server runs as __main__ with its own prepare_server_args binding:
    # this shows the hook reached it.
    missing = tmp_path / "no_model"
    done = run_python(["-m", "sglang.launch_server", "--model-path", str(missing),
                       "--disaggregation-mode", "asym-prefill"])
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "sglang-asym: error: --disaggregation-mode asym-prefill serves DeepSeek-V4.1 checkpoints only: "
        f"no config.json at {missing}")
