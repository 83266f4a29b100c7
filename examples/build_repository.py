#!/usr/bin/env python3
"""Build the example model repository: copy examples/model_repository and add the ONNX files.

Usage: python examples/build_repository.py DEST

The ONNX binaries are generated rather than committed (*.onnx is git-ignored); fixed seeds
make every build byte-identical. Models are saved with IR version 10 and opset 17 because
onnx 1.23 would write IR 14 by default, which onnxruntime 1.31 refuses to load.
`mlp_torch` (TorchScript), `mlp_openvino` (OpenVINO IR) and `mlp_tensorflow` (SavedModel)
carry the weights of `mlp_onnx`, converted or rebuilt with each framework's own tools; each is
written only where its framework is importable, and left out elsewhere. TensorFlow is large,
so the SavedModel is written by a child process (`build_repository.py --savedmodel DIR`).
"""
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Collection
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SOURCE = Path(__file__).resolve().parent / "model_repository"
IR_VERSION = 10
OPSET = 17
MLP_DIMS = (256, 1024, 1024, 256)
ADD_SUB_WIDTH = 16
IMAGE_SHAPE = (3, 224, 224)
EMBEDDING_WIDTH = 512


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tritond-examples")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def mlp_model(seed: int = 0) -> onnx.ModelProto:
    """Gemm+Relu MLP 256->1024->1024->256 with a dynamic batch dimension."""
    rng = np.random.default_rng(seed)
    nodes, weights = [], []
    prev = "INPUT0"
    layers = len(MLP_DIMS) - 1
    for i, (fan_in, fan_out) in enumerate(zip(MLP_DIMS, MLP_DIMS[1:])):
        w = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        b = (0.01 * rng.standard_normal(fan_out)).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        last = i == layers - 1
        out = "OUTPUT0" if last else f"gemm{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"B{i}"], [out]))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"relu{i}"]))
            prev = f"relu{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", MLP_DIMS[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", MLP_DIMS[-1]])],
        weights,
    )
    return _finish(graph)


def add_sub_model() -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 over FP32 [batch, 16]."""
    shape = ["batch", ADD_SUB_WIDTH]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return _finish(graph)


def mlp_torch_model(mlp: onnx.ModelProto):
    """The ONNX MLP as a TorchScript module with the same weights (so both models agree)."""
    import torch

    weights = {t.name: numpy_helper.to_array(t) for t in mlp.graph.initializer}
    layers = []
    for i in range(len(MLP_DIMS) - 1):
        linear = torch.nn.Linear(MLP_DIMS[i], MLP_DIMS[i + 1])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weights[f"W{i}"].T.copy()))
            linear.bias.copy_(torch.from_numpy(weights[f"B{i}"].copy()))
        layers += [linear, torch.nn.ReLU()] if i < len(MLP_DIMS) - 2 else [linear]
    module = torch.nn.Sequential(*layers).eval()
    return torch.jit.trace(module, torch.zeros(1, MLP_DIMS[0]))


def write_openvino_ir(onnx_path: Path, xml_path: Path) -> None:
    """Convert the ONNX MLP with OpenVINO's converter; the batch layout lets auto-complete batch it.
    Weights stay FP32 (OpenVINO would store FP16 by default) so the outputs match ONNX Runtime's."""
    import openvino as ov

    model = ov.convert_model(str(onnx_path))
    for port in (*model.inputs, *model.outputs):
        port.get_node().set_layout(ov.Layout("N?"))
    ov.save_model(model, str(xml_path), compress_to_fp16=False)


def write_savedmodel(path: Path) -> None:
    """The ONNX MLP as a TensorFlow module with the same weights, saved with its serving signature."""
    import tensorflow as tf

    weights = {t.name: numpy_helper.to_array(t) for t in mlp_model().graph.initializer}
    layers = len(MLP_DIMS) - 1

    class Mlp(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = [tf.Variable(weights[f"W{i}"]) for i in range(layers)]
            self.b = [tf.Variable(weights[f"B{i}"]) for i in range(layers)]

        @tf.function(input_signature=[tf.TensorSpec([None, MLP_DIMS[0]], tf.float32, name="INPUT0")])
        def serve(self, x):
            for i in range(layers):
                x = tf.matmul(x, self.w[i]) + self.b[i]
                if i < layers - 1:
                    x = tf.nn.relu(x)
            return {"OUTPUT0": x}

    module = Mlp()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def image_encoder_model(seed: int = 1) -> onnx.ModelProto:
    """IMAGE [batch, 3, 224, 224] -> 8x8 stride-8 conv (16 channels), Relu, 4x4 average pool,
    Gemm to 512, L2 normalization -> EMBEDDING [batch, 512]."""
    rng = np.random.default_rng(seed)
    channels, pooled = 16, IMAGE_SHAPE[1] // 8 // 4
    conv_w = (rng.standard_normal((channels, IMAGE_SHAPE[0], 8, 8)) / np.sqrt(3 * 64)).astype(np.float32)
    conv_b = (0.01 * rng.standard_normal(channels)).astype(np.float32)
    fan_in = channels * pooled * pooled
    gemm_w = (rng.standard_normal((fan_in, EMBEDDING_WIDTH)) / np.sqrt(fan_in)).astype(np.float32)
    gemm_b = (0.01 * rng.standard_normal(EMBEDDING_WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["IMAGE", "conv_w", "conv_b"], ["conv"], kernel_shape=[8, 8], strides=[8, 8]),
            helper.make_node("Relu", ["conv"], ["relu"]),
            helper.make_node("AveragePool", ["relu"], ["pool"], kernel_shape=[4, 4], strides=[4, 4]),
            helper.make_node("Flatten", ["pool"], ["flat"], axis=1),
            helper.make_node("Gemm", ["flat", "gemm_w", "gemm_b"], ["gemm"]),
            helper.make_node("LpNormalization", ["gemm"], ["EMBEDDING"], axis=1, p=2),
        ],
        "image_encoder",
        [helper.make_tensor_value_info("IMAGE", TensorProto.FLOAT, ["batch", *IMAGE_SHAPE])],
        [helper.make_tensor_value_info("EMBEDDING", TensorProto.FLOAT, ["batch", EMBEDDING_WIDTH])],
        [numpy_helper.from_array(a, n) for a, n in
         ((conv_w, "conv_w"), (conv_b, "conv_b"), (gemm_w, "gemm_w"), (gemm_b, "gemm_b"))],
    )
    return _finish(graph)


# Models that need a framework beyond onnx, and the module that must be importable for each.
FRAMEWORK_MODELS = {"mlp_torch": "torch", "mlp_openvino": "openvino", "mlp_tensorflow": "tensorflow"}


def build(dest: str, models: Collection[str] | None = None) -> None:
    """Copy the committed configs and Python models into dest and write the model files;
    `models` limits the build to those model names (default: all)."""
    root = Path(dest)
    names = sorted(p.name for p in SOURCE.iterdir() if p.is_dir())
    missing = {n for n, module in FRAMEWORK_MODELS.items() if importlib.util.find_spec(module) is None}
    skip = [n for n in names if n in missing or (models is not None and n not in models)]
    wanted = [n for n in names if n not in skip]
    shutil.copytree(SOURCE, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.onnx", *skip))
    mlp = mlp_model().SerializeToString()
    onnx_files = {
        "mlp_onnx": lambda: mlp,
        "mlp_onnx_nobatch": lambda: mlp,
        "add_sub_onnx": lambda: add_sub_model().SerializeToString(),
        "image_encoder_onnx": lambda: image_encoder_model().SerializeToString(),
    }
    for name in wanted:
        version = root / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        if name in onnx_files:
            (version / "model.onnx").write_bytes(onnx_files[name]())
    if "mlp_torch" in wanted:
        import torch

        torch.jit.save(mlp_torch_model(mlp_model()), str(root / "mlp_torch" / "1" / "model.pt"))
    if "mlp_openvino" in wanted:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "mlp.onnx"
            source.write_bytes(mlp)
            write_openvino_ir(source, root / "mlp_openvino" / "1" / "model.xml")
    if "mlp_tensorflow" in wanted:
        target = root / "mlp_tensorflow" / "1" / "model.savedmodel"
        shutil.rmtree(target, ignore_errors=True)
        done = subprocess.run([sys.executable, __file__, "--savedmodel", str(target)], capture_output=True,
                              text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        if done.returncode != 0:
            raise RuntimeError(f"writing the SavedModel failed:\n{done.stderr}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--savedmodel":
        write_savedmodel(Path(sys.argv[2]))
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build(sys.argv[1])
    print(f"model repository written to {sys.argv[1]}")


if __name__ == "__main__":
    main()
