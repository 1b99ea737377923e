#!/usr/bin/env bash
# CUDA checks and timings of the graph runner, as one prepared run on a lent GPU machine (~2-5 min):
#
#   bash scripts/gpu_check.sh            # from the device tool: run(command="bash scripts/gpu_check.sh", timeout_s=420)
#
# 1. the CUDA tests: the whole-forward decode graph (attention inside, release cache formats included)
#    replays equal to eager and to the uncaptured function, 128-row window and mixed steps replay equal
#    to eager, and the reference model on CUDA equals it on CPU (test/model/test_graph_runner_cuda.py),
#    plus the CPU graph-runner and decode-graph tests on that machine;
# 2. eager vs graph-replay timings per decode bucket on the small preset (benchmark/graph_timing.py);
# 3. sgl-kernel-ext's gather/scatter kernels: CUDA tests, then GB/s against the memory-bandwidth floor
#    (benchmark/kernels.py -> benchmark/results/kernels_gpu.json).
# It uses the machine's own python3, which holds a CUDA build of PyTorch (a venv made here holds a CPU
# build and would not help; the machine cannot download): this checkout's package and tests are put
# on PYTHONPATH, nothing is installed. Results: benchmark/results/gpu_check.json, and where $OUT is set
# (the device tool's result folder) a copy of it and the logs, to be copied back into the repo.
# GPU_CHECK_DRY_RUN=1 GPU_CHECK_PYTHON=.venv/bin/python rehearses the whole script on CPU (CUDA tests
# skip, tiny timing to /tmp) before spending device time. GPU_CHECK_ONLY=kernels runs section 3 alone
# (~2 min: run(command="GPU_CHECK_ONLY=kernels bash scripts/gpu_check.sh", timeout_s=420)).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${GPU_CHECK_PYTHON:-python3}
LOGS=${OUT:-/tmp/gpu_check}
RESULT=benchmark/results/gpu_check.json
TIMING_ARGS=(--preset small)
TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT:-150}
TIMING_TIMEOUT=${GPU_CHECK_TIMING_TIMEOUT:-170}
mkdir -p "$LOGS" benchmark/results
export PYTHONPATH="$PWD/python:$PWD/test${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
  RESULT=/tmp/gpu_check_dry_run.json
  TIMING_ARGS=(--preset tiny --device cpu --batches 1,4 --widths 1,4 --step-batches 2 --prompt-len 40 --steps 2 --iters 2)
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$LOGS/gpu_env.log"
  if ! "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda); sys.exit(0 if torch.cuda.is_available() else 1)' 2>&1 | tee -a "$LOGS/gpu_env.log"; then
    echo "gpu_check: $PY has no usable CUDA device; nothing to check here" >&2
    exit 2
  fi
fi

tests_rc=0 timing_rc=0
if [ "${GPU_CHECK_ONLY:-all}" != kernels ]; then   # GPU_CHECK_ONLY=kernels runs section 3 alone
  start=$SECONDS
  timeout "$TEST_TIMEOUT" "$PY" -m pytest -q -rs -p no:cacheprovider --durations=10 \
    test/model/test_graph_runner_cuda.py test/model/test_graph_runner.py test/model/test_decode_graph.py 2>&1 | tee "$LOGS/gpu_tests.log"
  tests_rc=${PIPESTATUS[0]}
  echo "gpu_check: tests rc=$tests_rc in $((SECONDS - start)) s"

  start=$SECONDS
  timeout "$TIMING_TIMEOUT" "$PY" benchmark/graph_timing.py "${TIMING_ARGS[@]}" --out "$RESULT" 2>&1 \
    | tee "$LOGS/gpu_timing.log"
  timing_rc=${PIPESTATUS[0]}
  echo "gpu_check: timing rc=$timing_rc in $((SECONDS - start)) s"
  if [ -n "${OUT:-}" ] && [ -f "$RESULT" ]; then
    cp "$RESULT" "$OUT/"
  fi
fi

# 3. sgl-kernel-ext (the payload's gather/scatter kernels): the compiled Triton kernel against the torch
#    reference byte for byte (test/kernels/test_kernels_cuda.py, plus the interpreter tests beside it),
#    then achieved GB/s against the memory-bandwidth floor (a contiguous device copy of the same bytes,
#    and the nominal HBM bandwidth) for the Flash manifest at N in {2K, 32K, 128K}, v41 and v4 layouts,
#    with the host CRC32C cost after a device-to-host copy (benchmark/kernels.py; ~1-2 min).
KERNELS_RESULT=benchmark/results/kernels_gpu.json
KERNELS_ARGS=(--device cuda --backends triton,torch --tokens 2048,32768,131072 --reps 10)
KERNELS_TIMEOUT=${GPU_CHECK_KERNELS_TIMEOUT:-240}
if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
  KERNELS_RESULT=/tmp/kernels_gpu_dry_run.json
  KERNELS_ARGS=(--device cpu --backends torch,triton --tokens 2048 --reps 1)
fi
export PYTHONPATH="$PWD/sgl-kernel-ext:$PYTHONPATH"
start=$SECONDS
timeout "$KERNELS_TIMEOUT" "$PY" -m pytest -q -rs -p no:cacheprovider \
  test/kernels/test_kernels_cuda.py test/kernels/test_kernels_copy.py 2>&1 | tee "$LOGS/kernels_tests.log"
kernels_tests_rc=${PIPESTATUS[0]}
timeout "$KERNELS_TIMEOUT" "$PY" benchmark/kernels.py "${KERNELS_ARGS[@]}" --out "$KERNELS_RESULT" 2>&1 \
  | tee "$LOGS/kernels_timing.log"
kernels_timing_rc=${PIPESTATUS[0]}
echo "gpu_check: kernels tests rc=$kernels_tests_rc, timing rc=$kernels_timing_rc in $((SECONDS - start)) s"
if [ -n "${OUT:-}" ] && [ -f "$KERNELS_RESULT" ]; then
  cp "$KERNELS_RESULT" "$OUT/"
fi

[ "$tests_rc" = 0 ] && [ "$timing_rc" = 0 ] && [ "$kernels_tests_rc" = 0 ] && [ "$kernels_timing_rc" = 0 ]
