#!/usr/bin/env bash
# Installs tritond with its test tools and runs the whole test suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export PATH="$PWD/.venv/perf_analyzer:$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest "$@"
