#!/usr/bin/env bash
# Installs tritond with what `tritond analyze` needs, builds the bundled example repository,
# and finds the best config of its ONNX MLP for throughput with p99 latency <= 10 ms.
# Extra arguments go to `tritond analyze` (e.g. --search brute, --max-latency-ms 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --analyze
.venv/bin/python examples/build_repository.py build/model_repository
exec .venv/bin/tritond analyze -m mlp_onnx --repository build/model_repository --max-latency-ms 10 \
  --output-dir build/analyze-mlp_onnx "$@"
