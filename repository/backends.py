"""The backends tritond runs and how Triton names their platforms and model files."""
from __future__ import annotations

ONNXRUNTIME = "onnxruntime"
PYTHON = "python"
PYTORCH = "pytorch"
TENSORRT = "tensorrt"
ENSEMBLE_PLATFORM = "ensemble"

KNOWN_BACKENDS = (ONNXRUNTIME, PYTHON, PYTORCH, TENSORRT)

# Backends whose models carry a platform name; python models have none in config.
BACKEND_PLATFORM: dict[str, str] = {
    ONNXRUNTIME: "onnxruntime_onnx",
    PYTORCH: "pytorch_libtorch",
    TENSORRT: "tensorrt_plan",
}
PLATFORM_BACKEND: dict[str, str] = {
    "onnxruntime_onnx": ONNXRUNTIME,
    "pytorch_libtorch": PYTORCH,
    "tensorrt_plan": TENSORRT,
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}

DEFAULT_MODEL_FILENAME: dict[str, str] = {
    ONNXRUNTIME: "model.onnx",
    PYTHON: "model.py",
    PYTORCH: "model.pt",
    TENSORRT: "model.plan",
}

# Files that identify a backend when a config names none, in Triton's order of
# preference, with whether the entry must be a directory (True), a file (False)
# or may be either (None).
DETECTION_ORDER: tuple[tuple[str, str, str, bool | None], ...] = (
    ("model.savedmodel", "tensorflow", "tensorflow_savedmodel", True),
    ("model.graphdef", "tensorflow", "tensorflow_graphdef", False),
    ("model.plan", TENSORRT, "tensorrt_plan", False),
    ("model.onnx", ONNXRUNTIME, "onnxruntime_onnx", None),
    ("model.xml", "openvino", "", None),
    ("model.pt", PYTORCH, "pytorch_libtorch", False),
    ("model.py", PYTHON, "", None),
)

FILENAME_BACKEND: dict[str, str] = {filename: backend for filename, backend, _, _ in DETECTION_ORDER}
