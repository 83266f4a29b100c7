"""Build the qa model repositories Triton's L0 suites read from `$DATADIR`, with the generator
scripts of a fetched Triton checkout (`qa/common/gen_qa_*.py`), for the CPU backends tritond
runs here: onnx and libtorch (python models are derived from the onnx ones by each test.sh), and
the onnx scalar models.

Run as `python gen_models.py <qa dir> <data dir>`. Each generator runs in this interpreter with
the generators' own `--onnx_opset` set to one onnxruntime supports and `onnx.save` clamping the
IR version to one it reads (onnx >= 1.21 writes newer ones by default); nothing else changes.
"""
from __future__ import annotations

import glob
import os
import runpy
import shutil
import sys

ONNX_IR_VERSION = 10
ONNX_OPSET = 21         # onnx's default opset may be newer than onnxruntime supports

# (repository under the data dir, generator, arguments)
JOBS: list[tuple[str, str, list[str]]] = [
    ("qa_model_repository", "gen_qa_models.py", ["--onnx", "--libtorch"]),
    ("qa_variable_model_repository", "gen_qa_models.py", ["--onnx", "--libtorch", "--variable"]),
    ("qa_identity_model_repository", "gen_qa_identity_models.py", ["--onnx", "--libtorch"]),
    ("qa_ragged_model_repository", "gen_qa_ragged_models.py", ["--onnx", "--libtorch"]),
    ("qa_reshape_model_repository", "gen_qa_reshape_models.py", ["--onnx", "--libtorch", "--variable"]),
    ("qa_scalar_models", "gen_qa_ort_scalar_models.py", [f"--onnx_opset={ONNX_OPSET}"]),
    ("qa_sequence_model_repository", "gen_qa_sequence_models.py", ["--onnx", "--libtorch"]),
    ("qa_variable_sequence_model_repository", "gen_qa_sequence_models.py", ["--onnx", "--libtorch", "--variable"]),
    ("qa_sequence_implicit_model_repository", "gen_qa_implicit_models.py", ["--onnx", "--libtorch"]),
    ("qa_variable_sequence_implicit_model_repository", "gen_qa_implicit_models.py",
     ["--onnx", "--libtorch", "--variable"]),
    ("qa_dyna_sequence_model_repository", "gen_qa_dyna_sequence_models.py", ["--onnx", "--libtorch"]),
    ("qa_dyna_sequence_implicit_model_repository", "gen_qa_dyna_sequence_implicit_models.py",
     ["--onnx", "--libtorch"]),
    ("qa_ensemble_model_repository/qa_model_repository", "gen_qa_models.py", ["--ensemble"]),
    ("qa_ensemble_model_repository/qa_variable_model_repository", "gen_qa_models.py",
     ["--ensemble", "--variable"]),
    ("qa_ensemble_model_repository/qa_identity_model_repository", "gen_qa_identity_models.py",
     ["--ensemble"]),
    ("qa_ensemble_model_repository/qa_reshape_model_repository", "gen_qa_reshape_models.py", ["--ensemble"]),
]


def _clamp_onnx_ir() -> None:
    import onnx

    original = onnx.save_model

    def save(model, f, *args, **kwargs):
        if model.ir_version > ONNX_IR_VERSION:
            model.ir_version = ONNX_IR_VERSION
        return original(model, f, *args, **kwargs)

    onnx.save = onnx.save_model = save


def main(qa_dir: str, data_dir: str) -> int:
    common = os.path.join(os.path.abspath(qa_dir), "common")
    sys.path.insert(0, common)
    _clamp_onnx_ir()
    for repo, script, args in JOBS:
        target = os.path.join(os.path.abspath(data_dir), repo)
        done = os.path.join(target, ".generated")
        if os.path.exists(done):
            continue
        os.makedirs(target, exist_ok=True)
        print(f"gen_models: {script} {' '.join(args)} -> {target}", flush=True)
        opset = [f"--onnx_opset={ONNX_OPSET}"] if "--onnx" in args else []
        sys.argv = [script, f"--models_dir={target}", *args, *opset]
        runpy.run_path(os.path.join(common, script), run_name="__main__")
        open(done, "w").close()
    # gen_qa_models.py makes BF16 models for every framework it is given when --onnx is one;
    # Triton's gen_qa_model_repository runs --libtorch alone, so its data has no libtorch BF16.
    for model in glob.glob(os.path.join(os.path.abspath(data_dir), "qa_*model_repository", "libtorch_*bf16*")):
        shutil.rmtree(model)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
