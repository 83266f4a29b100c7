"""The backends tritond runs: one record each, read by every process that needs to know one.

A record says how Triton names the backend's platforms and model files (autofill, validation,
metadata), which worker class executes it (imported by module name, only in its worker), what
its warm template imports ahead of its workers and whether CPU workers are forked from it
(broker/templates.py, workers/template.py), what `tritond check --memory` measures for it, and
which pip extra installs its framework. Pure data: no framework is imported here.

Adding a backend is one record in BACKENDS plus its worker module under workers/backends/.
Records are listed in the order Triton's autofill tries their model files.
"""
from __future__ import annotations

from dataclasses import dataclass

ONNXRUNTIME = "onnxruntime"
PYTHON = "python"
PYTORCH = "pytorch"
TENSORRT = "tensorrt"
OPENVINO = "openvino"
TENSORFLOW = "tensorflow"
IDENTITY = "identity"           # Triton's test backend: outputs copy inputs (no model file)
ENSEMBLE_PLATFORM = "ensemble"
SAVEDMODEL_PLATFORM = "tensorflow_savedmodel"
# A config's runtime naming a Python-based backend (Triton's): <backend-directory>/<backend>/model.py
# runs the model on the Python backend (repository/python_based.py).
PYTHON_RUNTIME = "model.py"
GRAPHDEF_PLATFORM = "tensorflow_graphdef"

_WORKERS = "tritond.workers.backends"


@dataclass(frozen=True)
class ModelFile:
    """A model file name that identifies the backend when a config names none: the platform it
    implies, and whether the entry must be a directory (True), a file (False) or either (None)."""
    name: str
    platform: str = ""
    directory: bool | None = None


@dataclass(frozen=True)
class BackendRecord:
    name: str
    worker: str                                 # "module:Class" that executes it in a worker
    platforms: tuple[str, ...] = ()             # first: the platform its configs carry
    model_files: tuple[ModelFile, ...] = ()     # first: its default model file
    preload: tuple[str, ...] = ()               # what its warm template imports; empty: no template
    forked: bool = False                        # CPU workers are forked from that template
    extra: str = ""                             # `pip install 'tritond[<extra>]'` adds its framework

    @property
    def platform(self) -> str:
        return self.platforms[0] if self.platforms else ""

    @property
    def model_file(self) -> str:
        return self.model_files[0].name if self.model_files else ""

    @property
    def worker_module(self) -> str:
        return self.worker.partition(":")[0]

    @property
    def worker_class(self) -> str:
        return self.worker.partition(":")[2]

    @property
    def memory_kind(self) -> str:
        """What `tritond check --memory` measures for its models: its template's imports ('' none)."""
        return self.name if self.preload else ""

    @property
    def install_hint(self) -> str:
        return f"pip install 'tritond[{self.extra}]'"


# Python threads started by importing openvino or tensorflow make their templates unsafe to
# fork from: they serve the memory probe only, and their workers are spawned.
BACKENDS: tuple[BackendRecord, ...] = (
    BackendRecord(TENSORFLOW, f"{_WORKERS}.tensorflow:TensorFlowBackend",
                  platforms=(SAVEDMODEL_PLATFORM, GRAPHDEF_PLATFORM),
                  model_files=(ModelFile("model.savedmodel", SAVEDMODEL_PLATFORM, True),
                               ModelFile("model.graphdef", GRAPHDEF_PLATFORM, False)),
                  preload=("tensorflow", f"{_WORKERS}.tensorflow"), extra="tensorflow"),
    BackendRecord(TENSORRT, f"{_WORKERS}.tensorrt:TensorRTBackend", platforms=("tensorrt_plan",),
                  model_files=(ModelFile("model.plan", "tensorrt_plan", False),), extra="tensorrt"),
    BackendRecord(ONNXRUNTIME, f"{_WORKERS}.onnxruntime:OnnxBackend", platforms=("onnxruntime_onnx",),
                  model_files=(ModelFile("model.onnx", "onnxruntime_onnx"),),
                  preload=("onnxruntime", f"{_WORKERS}.onnxruntime"), forked=True),
    BackendRecord(OPENVINO, f"{_WORKERS}.openvino:OpenVINOBackend", model_files=(ModelFile("model.xml"),),
                  preload=("openvino", f"{_WORKERS}.openvino"), extra="openvino"),
    BackendRecord(PYTORCH, f"{_WORKERS}.pytorch:TorchBackend", platforms=("pytorch_libtorch",),
                  model_files=(ModelFile("model.pt", "pytorch_libtorch", False),),
                  preload=("torch", f"{_WORKERS}.pytorch"), forked=True, extra="torch"),
    BackendRecord(PYTHON, f"{_WORKERS}.python:PythonBackend", model_files=(ModelFile("model.py"),),
                  preload=(f"{_WORKERS}.python",), forked=True),
    BackendRecord(IDENTITY, f"{_WORKERS}.identity:IdentityBackend"),
)

_BY_NAME = {b.name: b for b in BACKENDS}
_BY_PLATFORM = {p: b for b in BACKENDS for p in b.platforms}

KNOWN_BACKENDS = tuple(_BY_NAME)
# Lookups autofill and validation use, all read off the records.
BACKEND_PLATFORM: dict[str, str] = {b.name: b.platform for b in BACKENDS if b.platform}
PLATFORM_BACKEND: dict[str, str] = {p: b.name for p, b in _BY_PLATFORM.items()}
DEFAULT_MODEL_FILENAME: dict[str, str] = {b.name: b.model_file for b in BACKENDS if b.model_file}
DETECTION_ORDER: tuple[tuple[str, str, str, bool | None], ...] = tuple(
    (f.name, b.name, f.platform, f.directory) for b in BACKENDS for f in b.model_files)
FILENAME_BACKEND: dict[str, str] = {filename: backend for filename, backend, _, _ in DETECTION_ORDER}


class UnknownBackend(ValueError):
    pass


def backend_record(name: str) -> BackendRecord:
    """The record of backend `name`; UnknownBackend names the ones tritond runs."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownBackend(f"unknown backend '{name}'; tritond runs {', '.join(KNOWN_BACKENDS)}") from None


def runner(backend: str, runtime: str = "") -> str:
    """The backend whose workers run a model: python for a Python-based backend, else its own."""
    return PYTHON if runtime == PYTHON_RUNTIME else backend


def record_for(backend: str, platform: str, runtime: str = "") -> BackendRecord | None:
    """The record of the backend that runs a config (`runner`), else the one its `platform`
    implies, else None."""
    return _BY_NAME.get(runner(backend, runtime)) or _BY_PLATFORM.get(platform)
