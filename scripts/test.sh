#!/usr/bin/env bash
# The README's test command: install everything from nothing, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1 MC_LOG_LEVEL=ERROR
set +e
.venv/bin/python -m pytest test -q -p no:cacheprovider -n 2 --dist loadgroup --durations=60 \
  --junitxml=test-results/junit.xml "$@"  # scripts/suite_time.py sums it per module
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
exit "$rc"
