#!/usr/bin/env bash
# Installs tritond, builds the bundled example model repository, and serves it on
# HTTP :8000, gRPC :8001 and metrics :8002, with client shared memory allowed (a local demo on
# loopback, so that tritonclient's system shared memory works as it does against tritonserver
# started with --allow-client-shm=true). Installing and building run only when their inputs
# changed since they last succeeded (stamps in build/). Extra arguments go to `tritond start`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
setup_inputs=(pyproject.toml setup.cfg scripts/setup.sh)
if ! "$PY" scripts/up_to_date.py build/.setup.stamp "${setup_inputs[@]}" \
    || ! .venv/bin/tritond --version >/dev/null 2>&1; then
  bash scripts/setup.sh
  "$PY" scripts/up_to_date.py --write build/.setup.stamp "${setup_inputs[@]}"
fi
# The frameworks installed decide which example models are built.
build_inputs=(examples/build_repository.py examples/model_repository .venv/lib/python*/site-packages/*.dist-info)
if [ ! -d build/model_repository ] \
    || ! "$PY" scripts/up_to_date.py build/.model_repository.stamp "${build_inputs[@]}"; then
  .venv/bin/python examples/build_repository.py build/model_repository
  "$PY" scripts/up_to_date.py --write build/.model_repository.stamp "${build_inputs[@]}"
fi
exec .venv/bin/tritond start --model-repository build/model_repository --allow-client-shm=true "$@"
