#!/usr/bin/env bash
# The GPU checks in one go, for a host with a CUDA GPU and torch with CUDA already installed:
# installs tritond (its pure-Python dependencies from the carried wheelhouse .whl/ when they
# are missing), runs tests/gpu and prints a summary. Bounded well under 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
started=$(date +%s)
if ! "$PY" -c "import tritond.workers.backends.pytorch" 2>/dev/null; then
  if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --find-links .whl numpy pyzmq msgspec posix_ipc protobuf grpcio \
      'tritonclient[http,grpc]' starlette uvicorn httptools uvloop hypercorn orjson pytest 2>&1 | tail -3
  fi
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
fi
echo "== host"
nvidia-smi -L || echo "nvidia-smi: not available"
command -v nvidia-cuda-mps-control || echo "nvidia-cuda-mps-control: not on PATH (the MPS test will skip)"
"$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'available', torch.cuda.is_available())" \
  || echo "torch: not importable"
"$PY" -c "import cuda.bindings; print('cuda-bindings', cuda.bindings.__version__)" || echo "cuda-bindings: not importable"
echo "== tests/gpu"
log=$(mktemp)
timeout 480 "$PY" -m pytest tests/gpu -v -rs -p no:cacheprovider 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "== summary: exit $rc after $(( $(date +%s) - started )) s"
grep -E " (PASSED|FAILED|ERROR)|^SKIPPED|^(FAILED|ERROR) " "$log" | sed 's/ *\[ *[0-9]*%\]//'
tail -1 "$log"
[ "$rc" = 5 ] && echo "no GPU test ran: every module skipped (reasons above)"
rm -f "$log"
exit "$rc"
