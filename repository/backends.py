"""The backends tritond runs and how Triton names their platforms and model files."""
from __future__ import annotations

ONNXRUNTIME = "onnxruntime"
PYTHON = "python"
PYTORCH = "pytorch"
TENSORRT = "tensorrt"
OPENVINO = "openvino"
TENSORFLOW = "tensorflow"
IDENTITY = "identity"           # Triton's test backend: outputs copy inputs (no model file)
ENSEMBLE_PLATFORM = "ensemble"
SAVEDMODEL_PLATFORM = "tensorflow_savedmodel"
GRAPHDEF_PLATFORM = "tensorflow_graphdef"

KNOWN_BACKENDS = (ONNXRUNTIME, PYTHON, PYTORCH, TENSORRT, OPENVINO, TENSORFLOW, IDENTITY)

# Backends whose models carry a platform name; python models have none in config.
BACKEND_PLATFORM: dict[str, str] = {
    ONNXRUNTIME: "onnxruntime_onnx",
    PYTORCH: "pytorch_libtorch",
    TENSORRT: "tensorrt_plan",
    TENSORFLOW: SAVEDMODEL_PLATFORM,
}
PLATFORM_BACKEND: dict[str, str] = {
    "onnxruntime_onnx": ONNXRUNTIME,
    "pytorch_libtorch": PYTORCH,
    "tensorrt_plan": TENSORRT,
    SAVEDMODEL_PLATFORM: TENSORFLOW,
    GRAPHDEF_PLATFORM: TENSORFLOW,
}

DEFAULT_MODEL_FILENAME: dict[str, str] = {
    ONNXRUNTIME: "model.onnx",
    PYTHON: "model.py",
    PYTORCH: "model.pt",
    TENSORRT: "model.plan",
    OPENVINO: "model.xml",
    TENSORFLOW: "model.savedmodel",
}

# Files that identify a backend when a config names none, in Triton's order of
# preference, with whether the entry must be a directory (True), a file (False)
# or may be either (None).
DETECTION_ORDER: tuple[tuple[str, str, str, bool | None], ...] = (
    ("model.savedmodel", TENSORFLOW, SAVEDMODEL_PLATFORM, True),
    ("model.graphdef", TENSORFLOW, GRAPHDEF_PLATFORM, False),
    ("model.plan", TENSORRT, "tensorrt_plan", False),
    ("model.onnx", ONNXRUNTIME, "onnxruntime_onnx", None),
    ("model.xml", OPENVINO, "", None),
    ("model.pt", PYTORCH, "pytorch_libtorch", False),
    ("model.py", PYTHON, "", None),
)

FILENAME_BACKEND: dict[str, str] = {filename: backend for filename, backend, _, _ in DETECTION_ORDER}
