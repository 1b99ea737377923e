#!/usr/bin/env bash
# Resolves what `pip install '.[gpu,test]'` installs on a Linux x86_64 GPU server, on any machine and
# without downloading it: SGLang 0.5.23's CUDA stack is several GB (torch 2.14.1 alone is a 555 MB wheel).
# pip reads each wheel's metadata only: from the index's metadata files where it serves them (PEP 658),
# else through HTTP range requests into the wheel (--use-feature=fast-deps). Fails if the declared
# dependencies and SGLang 0.5.23's own cannot be installed together, or if the resolution is not the one
# the README states (torch 2.14.1, SGLang 0.5.23, Mooncake's CUDA 13 build and no non-CUDA build).
# Usage: scripts/check_gpu_resolution.sh [OUT_DIR]   (default benchmark/results; PYTHON_VERSION=3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
OUT=${1:-benchmark/results}
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "pip>=25" 2>&1 | grep -v "is ignored" || true

# The requirements of '.[gpu,test]', read from pyproject.toml: pip resolves a local project only by
# building it, which a resolution for another platform (--only-binary=:all:) does not allow.
python3 - "$work/requirements.txt" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
lines = project["dependencies"] + extras["gpu"] + extras["test"]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY

# manylinux tags are not implied by one another under --platform: name every glibc level up to 2.35.
platforms=(--platform linux_x86_64 --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for minor in $(seq 5 35); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done

start=$(date +%s)
# pip's log names each file it downloads whole ("Downloading NAME (SIZE)"); a metadata read does not.
"$work/venv/bin/pip" install --dry-run --ignore-installed --use-feature=fast-deps \
  --only-binary=:all: --python-version "$PYTHON_VERSION" "${platforms[@]}" --target "$work/target" \
  --cache-dir "$work/cache" --report "$work/report.json" -r "$work/requirements.txt" > "$work/pip.log" 2>&1 || true
seconds=$(( $(date +%s) - start ))
[ -s "$work/report.json" ] || { grep -v "is ignored" "$work/pip.log" | tail -20 >&2; echo "[check_gpu_resolution] pip found no resolution" >&2; exit 1; }
grep -E "^ *Downloading " "$work/pip.log" | sed -E 's/^ *Downloading //' > "$work/downloads.txt" || true

mkdir -p "$OUT"
python3 - "$work/report.json" "$OUT" "$PYTHON_VERSION" "$seconds" "$work/downloads.txt" <<'PY'
import json, re, sys
from pathlib import Path
report, out, python_version, seconds, downloads = sys.argv[1:]
whole = Path(downloads).read_text().split("\n")
whole = [line for line in whole if line]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
resolved = {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in json.load(open(report))["install"]}
key = ["sglang", "torch", "mooncake-transfer-engine-cuda13", "sglang-router", "smg", "sglang-kernel",
       "flashinfer-python", "triton", "tokenizers", "pyzmq", "prometheus-client", "transformers"]
summary = {
    "what": "pip's resolution of '.[gpu,test]' for Linux x86_64 (no download: wheel metadata only)",
    "python_version": python_version,
    "wall_s": int(seconds),
    "downloaded_whole": whole,  # files pip fetched entirely; wheels are read through their metadata
    "packages": len(resolved),
    "key_versions": {name: resolved.get(name) for name in key},
    "resolved": dict(sorted(resolved.items())),
}
Path(out, "gpu_resolution.json").write_text(json.dumps(summary, indent=1) + "\n")
expected = {"sglang": "0.5.23", "torch": "2.14.1", "mooncake-transfer-engine-cuda13": "0.3.13.post1"}
wrong = {n: resolved.get(n) for n, v in expected.items() if resolved.get(n) != v}
forbidden = sorted(n for n in resolved if n in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"))
if wrong or forbidden:
    sys.exit(f"[check_gpu_resolution] unexpected resolution: {wrong} {forbidden}")
if any(line.endswith(".whl") or ".whl " in line for line in whole):
    sys.exit(f"[check_gpu_resolution] pip downloaded whole wheels: {whole}")
print(f"[check_gpu_resolution] {len(resolved)} packages resolve together in {seconds} s, "
      f"{len(whole)} files downloaded whole: " + ", ".join(f"{n} {resolved.get(n)}" for n in key))
PY
