#!/usr/bin/env bash
# The tests against the real vLLM (tests/vllm/, marked `vllm`), in a virtual
# environment of their own with vllm==0.33.0 pinned (kvspec's `vllm` extra) and
# kvspec installed from this clone. Everything it downloads or caches stays in
# build/vllm/ inside the clone (git ignores build/). No GPU: vLLM runs on its
# CPU platform and builds models on the meta device.
#
#   bash tests/vllm/run.sh [pytest args...]
#
# About 6 minutes and 9 GB the first time (vLLM brings a CUDA build of torch);
# reruns reuse the environment.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROOT="$PWD/build/vllm"
VENV="$ROOT/venv"
mkdir -p "$ROOT/cache" "$ROOT/tmp"
export XDG_CACHE_HOME="$ROOT/cache" VLLM_CACHE_ROOT="$ROOT/cache/vllm" HF_HOME="$ROOT/cache/hf"
export TMPDIR="$ROOT/tmp" PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q -e '.[vllm,test]'
installed=$(date +%s)
version=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("vllm"))')
if [ "${version%%+*}" != "0.33.0" ]; then
  echo "tests/vllm/run.sh: vLLM $version is installed, the tests need 0.33.0" >&2
  exit 1
fi
echo "vLLM $version ready in $((installed - start)) s"
"$VENV/bin/python" -m pytest -q -p no:warnings -m vllm tests/vllm "$@"
echo "vLLM tests took $(( $(date +%s) - installed )) s"
