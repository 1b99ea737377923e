"""sglang-asym as a SGLang 0.5.23 plugin (entry-point group `sglang.srt.plugins`, name `sglang_asym`).

SGLang's `load_plugins()` calls `register` in the launcher and in every scheduler, detokenizer and
DP-controller process (`SGLANG_PLUGINS=sglang_asym` restricts loading to this plugin). `register`
only records hooks; SGLang applies them right after. See hooks.py for what is hooked: the shared
room's table and the installer of every room's table (shared/, prefill/, decode/, cpu_platform/).
"""


def register() -> None:
    from .hooks import register_hooks

    register_hooks()
