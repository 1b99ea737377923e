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

# pip's messages without its notes on the machine's constraint file; pip's own exit status stays the
# step's (pipefail), so a failed install stops here with pip's error above it.
pip_quiet() { "$@" 2>&1 | { grep -v "is ignored" || true; }; }

# The two venvs take about 3.2 + 1.2 GB; the tests' checkpoints and logs about 1 GB more. A disk that
# cannot hold them fails in the middle of a download, so say it first.
need_mb=1024
[ -x .venv/bin/python ] || need_mb=$((need_mb + 3500))
[ "${SKIP_ORACLE:-0}" = 1 ] || [ -x .venv-oracle/bin/python ] || need_mb=$((need_mb + 1400))
free_mb=$(df -Pm . | awk 'NR == 2 {print $4}')
if [ "$free_mb" -lt "$need_mb" ]; then
  echo "[setup] $(pwd) has $free_mb MB free on its disk; the venvs and the tests need about $need_mb MB" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
# torch==2.13.0 resolves to the CPU build here (2.13.0+cpu, from the machine's wheel folder); the cpu
# extra and constraints-sglang.txt then keep it.
pip_quiet .venv/bin/pip install -q torch==2.13.0
# The package through the CPU route's extra (editable; its wheel also ships the start-up hook
# sglang_asym_startup.pth, see setup.py), under the CPU route's constraints (torch stays 2.13.0).
pip_quiet .venv/bin/pip install -q -c constraints-sglang.txt -e '.[cpu,test]'
.venv/bin/python -c 'import torch, sglang_asym; print("[setup] .venv ready: torch", torch.__version__)'
# SGLang 0.5.23 itself, with --no-deps: its metadata pins torch 2.14.1 and the CUDA stack (the gpu extra's
# route), which would replace the CPU torch; so it is not in the cpu extra.
if [ "${SKIP_SGLANG:-0}" != 1 ]; then bash scripts/setup_sglang.sh .venv; fi

if [ "${SKIP_ORACLE:-0}" != 1 ]; then
  if [ ! -x .venv-oracle/bin/python ]; then python3 -m venv .venv-oracle; fi
  pip_quiet .venv-oracle/bin/pip install -q torch==2.13.0
  pip_quiet .venv-oracle/bin/pip install -q -r requirements-oracle.txt
  pip_quiet .venv-oracle/bin/pip install -q --no-deps nemo-automodel==0.7.0
  .venv-oracle/bin/python -c 'import nemo_automodel.components.models.deepseek_v41 as m; print("[setup] .venv-oracle ready")'
fi
