#!/usr/bin/env bash
# The README's main command: install what is needed, then
# 1. the mission's command line: `python -m sglang.launch_server --device cpu --disaggregation-mode
#    asym-prefill` and `asym-decode` (SGLang's own server with this plugin) behind the real sglang-router,
#    answering prompts on 127.0.0.1, checked token for token against the embedded runtime's pair
#    (scripts/demo_sglang_engine.py; a random-weight checkpoint at SGLang's pool geometry);
# 2. the embedded runtime's router + asym-prefill + asym-decode (and a colocated reference) serving the
#    committed trained tiny V4.1 checkpoint, so the outputs read as text (scripts/demo.py).
# Each part stops everything it started. DEMO_PARTS=sglang or DEMO_PARTS=embedded runs one part.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_ORACLE=1 bash scripts/setup.sh
export MC_LOG_LEVEL=ERROR PYTHONUNBUFFERED=1
# four servers share the machine: a quarter of the cores each (more threads than cores stall every forward)
threads=$(( $(nproc) / 4 )); (( threads >= 1 )) || threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
parts=${DEMO_PARTS:-sglang,embedded}
if [[ ",$parts," == *",sglang,"* ]]; then
  .venv/bin/python scripts/demo_sglang_engine.py
fi
if [[ ",$parts," == *",embedded,"* ]]; then
  .venv/bin/python scripts/demo.py "$@"
fi
