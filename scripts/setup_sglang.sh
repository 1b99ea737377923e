#!/usr/bin/env bash
# Installs SGLang 0.5.23 into a venv on a machine without a GPU. Idempotent.
#   sglang itself goes in with --no-deps: its requirements pin torch 2.14.1 and a multi-GB CUDA stack
#   that nothing here runs, and a resolver would replace the CPU torch 2.13.0 with it. The light
#   packages its imports need come with sglang-asym's `cpu` extra (scripts/setup.sh installs it, under
#   constraints-sglang.txt, which keeps torch at the 2.13.0 CPU build).
# Usage: scripts/setup_sglang.sh [VENV]   (default .venv; scripts/setup.sh must have run first)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV=${1:-.venv}
SGLANG_PIN=sglang==0.5.23
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then echo "[setup_sglang] no venv at $VENV (run scripts/setup.sh first)" >&2; exit 1; fi
torch_version=$("$PY" -c 'import torch; print(torch.__version__)')
if [ "$torch_version" != "2.13.0+cpu" ]; then
  echo "[setup_sglang] $VENV has torch $torch_version; expected 2.13.0+cpu" >&2; exit 1
fi

want=${SGLANG_PIN#sglang==}
have=$("$PY" -c 'import importlib.metadata as m; print(m.version("sglang"))' 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  # pip's status stays the step's (pipefail); only its notes on the machine's constraint file go
  "$VENV/bin/pip" install -q --no-deps "$SGLANG_PIN" 2>&1 | { grep -v "is ignored" || true; }
fi

# torch must still be the CPU build: a resolver that pulled torch 2.14.1 would break everything.
"$PY" -W ignore - <<'PY'
import torch
assert torch.__version__ == "2.13.0+cpu", f"torch changed to {torch.__version__}"
from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
cpu_import_gaps.install()
import sglang, sglang.srt.server_args, sglang.srt.plugins.hook_registry
import sglang.srt.models.deepseek_v4, sglang.srt.mem_cache.deepseek_v4_memory_pool
import sglang.srt.disaggregation.mooncake.conn
print("[setup_sglang] sglang", sglang.__version__, "ready beside torch", torch.__version__)
PY
