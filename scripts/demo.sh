#!/usr/bin/env bash
# The README's main command: install what is needed, then the mission's command line:
# `python -m sglang.launch_server --device cpu --disaggregation-mode asym-prefill` and `asym-decode`
# (SGLang's own server with this plugin) behind the real sglang-router, answering prompts on 127.0.0.1,
# each greedy output checked token for token against the in-process reference model
# (scripts/demo_sglang_engine.py: a random-weight small checkpoint at SGLang's pool geometry, then the
# committed trained tiny model answering text).
# It stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_ORACLE=1 bash scripts/setup.sh
export MC_LOG_LEVEL=ERROR PYTHONUNBUFFERED=1
# two servers share the machine: half of the cores each (more threads than cores stall every forward)
threads=$(( $(nproc) / 2 )); (( threads >= 1 )) || threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
.venv/bin/python scripts/demo_sglang_engine.py "$@"
