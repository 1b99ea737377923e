#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine. Idempotent.
#   .venv         the project through its `cpu` extra (torch 2.13.0 CPU build, Mooncake's non-CUDA build,
#                 the router, SGLang 0.5.23 without its CUDA stack; sglang-asym editable)
#   .venv-oracle  NVIDIA nemo-automodel 0.7.0's DeepSeek-V4.1 (independent oracle for tests)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! python3 -c 'import ctypes.util,sys; sys.exit(0 if ctypes.util.find_library("ibverbs") else 1)'; then
  echo "[setup] installing libibverbs1 (Mooncake needs it)"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq libibverbs1 >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq libibverbs1 >/dev/null; fi
fi

if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
# torch==2.13.0 resolves to the CPU build here (2.13.0+cpu, from the machine's wheel folder); the cpu
# extra and constraints-sglang.txt then keep it.
.venv/bin/pip install -q torch==2.13.0 2>&1 | grep -v "is ignored" || true
# The package through the CPU route's extra (editable; its wheel also ships the start-up hook
# sglang_asym_startup.pth, see setup.py), under the CPU route's constraints (torch stays 2.13.0).
.venv/bin/pip install -q -c constraints-sglang.txt -e '.[cpu,test]' 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c 'import torch, sglang_asym; print("[setup] .venv ready: torch", torch.__version__)'
# SGLang 0.5.23 itself, with --no-deps: its metadata pins torch 2.14.1 and the CUDA stack (the gpu extra's
# route), which would replace the CPU torch; so it is not in the cpu extra.
if [ "${SKIP_SGLANG:-0}" != 1 ]; then bash scripts/setup_sglang.sh .venv; fi

if [ "${SKIP_ORACLE:-0}" != 1 ]; then
  if [ ! -x .venv-oracle/bin/python ]; then python3 -m venv .venv-oracle; fi
  .venv-oracle/bin/pip install -q torch==2.13.0 2>&1 | grep -v "is ignored" || true
  .venv-oracle/bin/pip install -q -r requirements-oracle.txt 2>&1 | grep -v "is ignored" || true
  .venv-oracle/bin/pip install -q --no-deps nemo-automodel==0.7.0 2>&1 | grep -v "is ignored" || true
  .venv-oracle/bin/python -c 'import nemo_automodel.components.models.deepseek_v41 as m; print("[setup] .venv-oracle ready")'
fi
