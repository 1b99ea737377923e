"""Run by sglang_asym_startup.pth at interpreter start: in processes spawned by a CPU-engine SGLang
launcher (the flag below is set), install sglang-asym's CPU import stand-ins; elsewhere nothing."""

import os

if os.environ.get("SGLANG_ASYM_CPU_ENGINE") == "1":
    try:
        from sglang_asym.sglang_plugin.cpu_platform.startup import run
    except ImportError:  # the main package was uninstalled: leave the interpreter alone
        pass
    else:
        run()
