"""Run in a process of its own by test_plugin_process.py: loads plugins the way SGLang's launcher does,
then parses command lines with the (hooked) prepare_server_args and prints what came out as JSON.

    python test/sglang_plugin/plugin_driver.py V41_CHECKPOINT_DIR LLAMA_CHECKPOINT_DIR
"""

import contextlib
import io
import json
import pickle
import sys


def main(v41: str, llama: str) -> None:
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    load_plugins()

    import sglang.srt.server_args as server_args_module

    from sglang_asym.sglang_plugin.shared.settings import settings_of

    def run(argv):
        stderr = io.StringIO()
        outcome = {"argv": argv}
        with contextlib.redirect_stderr(stderr):
            try:
                record = server_args_module.prepare_server_args(argv)
            except SystemExit as exc:
                outcome.update(exit=exc.code, stderr=stderr.getvalue())
                return outcome
        settings = settings_of(pickle.loads(pickle.dumps(record)))  # what a scheduler process receives
        outcome.update(mode=record.disaggregation_mode, device=record.device,
                       settings=None if settings is None else [settings.mode, settings.window, settings.semantics])
        return outcome

    cases = [
        ["--model-path", v41, "--disaggregation-mode", "asym-prefill", "--device", "cuda"],
        ["--model-path", v41, "--disaggregation-mode", "asym-decode", "--device", "cuda",
         "--asym-window", "128", "--asym-semantics", "asym"],
        ["--model-path", llama, "--disaggregation-mode", "decode", "--device", "cuda"],
        ["--model-path", v41, "--disaggregation-mode", "asym-prefill", "--device", "cuda",
         "--disaggregation-transfer-backend", "nixl"],
        ["--model-path", v41, "--disaggregation-mode", "asym-decode", "--device", "cpu", "--port", "31000"],
        ["--model-path", v41, "--device", "cpu"],
        ["--model-path", llama, "--device", "cpu"],
    ]
    outcomes = [run(argv) for argv in cases]
    report = {
        "hooks": {target: [(t.name, s.plugin_name, s.dist_name) for t, _, s in entries]
                  for target, entries in HookRegistry._hooks.items()},
        "patched": sorted(HookRegistry._patched),
        "cases": outcomes,
    }
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:3])
