#!/usr/bin/env bash
# Run Triton's own L0 conformance suites against tritond and print pass/fail/skip per module.
#
#   bash tests/conformance/run_qa.sh <triton-server checkout> [qa_run.py options] [suite ...]
#
# <triton-server checkout>: a work tree of triton-inference-server/server (with qa/ and
# docs/examples/model_repository/), or its bare git directory (as the `fetch` tool leaves it),
# from which those two folders are exported. Nothing is downloaded: the qa model repositories
# are built with the checkout's own generators (qa/common/gen_qa_*.py) for onnx and libtorch.
# Work files go under $QA_WORK (default /tmp/tritond-qa); the generated models are kept there
# between runs. Suites: see README.md (default: all); qa_suites.py lists them.
# Options: --drop MODEL[,MODEL] leaves models out of every repository (each printed in the
# summary). QA_SEQUENCE_TRIALS picks L0_sequence_batcher's trials (default "0 1 2 4 v").
# The suites need ports 8000-8002 free.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
WORK="${QA_WORK:-/tmp/tritond-qa}"

if [ $# -lt 1 ]; then
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
SRC="$(cd "$1" && pwd)"
shift

missing=$("$PY" - <<'PY'
import importlib.util
need = ["tritonclient.http", "tritonclient.grpc", "numpy", "onnx", "torch", "psutil", "requests", "ml_dtypes",
        "sseclient"]
print(" ".join(m for m in need if importlib.util.find_spec(m.split(".")[0]) is None))
PY
)
if [ -n "$missing" ]; then
    echo "run_qa.sh: the qa tests need these python modules in $PY: $missing" >&2
    echo "           (pip install them into the venv; this script downloads nothing)" >&2
    exit 2
fi

mkdir -p "$WORK"
rm -rf "$WORK/src" && mkdir -p "$WORK/src"
if [ -d "$SRC/qa" ]; then
    cp -r "$SRC/qa" "$WORK/src/qa"
    mkdir -p "$WORK/src/docs/examples"
    cp -r "$SRC/docs/examples/model_repository" "$WORK/src/docs/examples/"
    if [ -d "$SRC/python/openai" ]; then
        mkdir -p "$WORK/src/python" && cp -r "$SRC/python/openai" "$WORK/src/python/openai"
    fi
elif git --git-dir="$SRC" rev-parse --verify HEAD >/dev/null 2>&1; then
    git --git-dir="$SRC" archive HEAD qa docs/examples/model_repository | tar -x -C "$WORK/src"
    if git --git-dir="$SRC" cat-file -e HEAD:python/openai 2>/dev/null; then
        git --git-dir="$SRC" archive HEAD python/openai | tar -x -C "$WORK/src"
    fi
else
    echo "run_qa.sh: $SRC is neither a triton-inference-server/server work tree nor its git directory" >&2
    exit 2
fi

"$PY" "$HERE/gen_models.py" "$WORK/src/qa" "$WORK/data" > "$WORK/gen_models.log" 2>&1 || { tail -30 "$WORK/gen_models.log"; exit 1; }
export PYTHONDONTWRITEBYTECODE=1
exec "$PY" "$HERE/qa_run.py" --qa "$WORK/src/qa" --data "$WORK/data" \
    --examples "$WORK/src/docs/examples/model_repository" --results "$WORK/results" "$@"
