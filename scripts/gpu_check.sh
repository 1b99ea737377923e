#!/usr/bin/env bash
# The checks of this project that need a CUDA machine with SGLang's CUDA stack (the `gpu` extra), as one run:
#
#   GPU_CHECK_PYTHON=.venv-gpu/bin/python bash scripts/gpu_check.sh      # .github/workflows/gpu.yml runs it
#
# 1. environment: the GPU, torch's CUDA build, SGLang's version;
# 1b. the planner's calibration (python -m sglang_asym.plan.calibrate, torch only, so it runs before the SGLang
#    check): achieved HBM bandwidth and BF16 GEMM FLOP/s over the GPU's table peaks, written to
#    $LOGS/calibration.json for $SGLANG_ASYM_PLAN_CALIBRATION (README, "Sizing GPU pools");
# 2. the plugin's CUDA launch guards against SGLang's own ServerArgs records on this machine
#    (test/sglang_plugin/test_cuda_guards.py): what the asymmetric servers refuse on CUDA, and why;
# 3. P's cut inside SGLang's DeepseekV4Model loop (test/sglang_plugin/test_prefill_cut_hook.py): the loop
#    stops after layer 19, layer 20 writes only its KV path, lm_head is never reached;
# 4. the asymmetric pair against SGLang's own colocated server (scripts/gpu_pair_check.py): a small random V4.1
#    checkpoint in the released layout served by SGLang's colocated server with its defaults (bounded replay on),
#    then by asym-prefill + asym-decode behind sglang-router; greedy tokens for N in {1, 127, 128, 129, 1000, 4097},
#    a pass/fail table and each server's GPU memory ($LOGS/pair_check.json).
# No GPU has run steps 3-4 yet (README, "Only checkable on a GPU"); `--device cpu` runs step 4 on the CPU route.
# Logs go to $OUT (the device tool's result folder, or a workflow's artifact folder) or /tmp/gpu_check.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${GPU_CHECK_PYTHON:-python3}
LOGS=${OUT:-/tmp/gpu_check}
TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT:-600}
mkdir -p "$LOGS"
export PYTHONPATH="$PWD/python:$PWD/test${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$LOGS/gpu_env.log"
if ! "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda); sys.exit(0 if torch.cuda.is_available() else 1)' 2>&1 | tee -a "$LOGS/gpu_env.log"; then
  echo "gpu_check: $PY has no usable CUDA device; nothing to check here" >&2
  exit 2
fi
# the GPU's name is read from torch and mapped to the planner's table; a part the table lacks writes no file
timeout "$TEST_TIMEOUT" "$PY" -m sglang_asym.plan.calibrate --device cuda --gpu auto --out "$LOGS/calibration.json" \
  2>&1 | tee "$LOGS/calibration.log"
calibrate_rc=${PIPESTATUS[0]}
echo "gpu_check: calibration rc=$calibrate_rc"
if ! "$PY" -c 'import sglang; print("sglang", sglang.__version__)' 2>&1 | tee -a "$LOGS/gpu_env.log"; then
  echo "gpu_check: $PY has no SGLang; install the gpu extra first (README, GPU server)" >&2
  exit 2
fi

timeout "$TEST_TIMEOUT" "$PY" -m pytest -q -rs -p no:cacheprovider --durations=10 \
  test/sglang_plugin/test_cuda_guards.py test/sglang_plugin/test_prefill_cut_hook.py 2>&1 | tee "$LOGS/gpu_tests.log"
rc=${PIPESTATUS[0]}
echo "gpu_check: tests rc=$rc"
timeout "${GPU_PAIR_TIMEOUT:-1800}" "$PY" scripts/gpu_pair_check.py --device cuda --out "$LOGS" 2>&1 | tee "$LOGS/pair_check.log"
pair_rc=${PIPESTATUS[0]}
echo "gpu_check: pair rc=$pair_rc"
[ "$rc" -eq 0 ] && rc=$pair_rc
[ "$rc" -eq 0 ] && rc=$calibrate_rc
exit "$rc"
