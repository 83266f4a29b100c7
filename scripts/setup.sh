#!/usr/bin/env bash
# Creates .venv with tritond installed (editable). With --test, also the test tools, the
# OpenVINO and TensorFlow (CPU) extras, torch, perf_analyzer and Chromium (Debian package;
# renders the analyze report in a test); with --analyze, what `tritond analyze` needs for its
# report. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
if [ "${1:-}" = "--test" ]; then
  .venv/bin/python -m pip install -q -e '.[test,openvino,tensorflow]'
  .venv/bin/python -m pip install -q 'torch==2.13.0' || echo "setup: torch 2.13.0 not installable here; PyTorch tests will skip"
  if [ ! -x .venv/perf_analyzer/perf_analyzer ]; then
    PATH="$PWD/.venv/bin:$PATH" bash scripts/install-perf-analyzer "$PWD/.venv/perf_analyzer" \
      || echo "setup: perf_analyzer could not be installed; its tests will skip"
  fi
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      export DEBIAN_FRONTEND=noninteractive
      (apt-get install -y -qq chromium >/dev/null 2>&1) \
        || { apt-get update -qq >/dev/null 2>&1; apt-get install -y -qq chromium >/dev/null 2>&1; } \
        || echo "setup: chromium could not be installed; the report rendering test will skip"
    else
      echo "setup: chromium is missing (apt-get install chromium, as root); the report rendering test will skip"
    fi
  fi
elif [ "${1:-}" = "--analyze" ]; then
  .venv/bin/python -m pip install -q -e '.[analyze]'
else
  .venv/bin/python -m pip install -q -e .
fi
