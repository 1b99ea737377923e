#!/usr/bin/env bash
# The README's main command: install what is needed, start the real router + asym-prefill + asym-decode
# (and a colocated reference) on 127.0.0.1 with the committed trained tiny V4.1 checkpoint, send prompts,
# print what happened, stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_ORACLE=1 SKIP_SGLANG=1 bash scripts/setup.sh
export MC_LOG_LEVEL=ERROR PYTHONUNBUFFERED=1
exec .venv/bin/python scripts/demo.py "$@"
