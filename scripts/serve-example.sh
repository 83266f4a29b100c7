#!/usr/bin/env bash
# Installs tritond, builds the bundled example model repository, and serves it on
# HTTP :8000, gRPC :8001 and metrics :8002. Extra arguments go to `tritond start`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python examples/build_repository.py build/model_repository
exec .venv/bin/tritond start --model-repository build/model_repository "$@"
