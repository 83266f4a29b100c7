"""Checks a normalized config the way Triton's ValidateModelConfig does, plus what tritond can run.

A model that fails here is marked unavailable with a message naming model, file
and field, before any worker is started for it.
"""
from __future__ import annotations

import ast
import os
from typing import Callable

from tritonclient.grpc import model_config_pb2

from . import devices
from .backends import (
    BACKEND_PLATFORM,
    DEFAULT_MODEL_FILENAME,
    ENSEMBLE_PLATFORM,
    GRAPHDEF_PLATFORM,
    IDENTITY,
    KNOWN_BACKENDS,
    PYTHON,
    PYTHON_RUNTIME,
    TENSORFLOW,
    TENSORRT,
    runner,
)
from .errors import ConfigError, UnpolledError
from .ensemble_flow import flow_error
from .idempotent import check_idempotent
from .layout import version_dirs
from .model_metrics import check_model_metrics
from .python_based import DEFAULT_BACKEND_DIRECTORY, runtime_model_file
from .ragged import check_ragged
from .unsupported import check_supported
from .sequence_config import check_sequence_batching
from .threads import check_thread_parameters

DataType = model_config_pb2.DataType
Kind = model_config_pb2.ModelInstanceGroup.Kind
Format = model_config_pb2.ModelInput.Format
TimeoutAction = model_config_pb2.ModelQueuePolicy.TimeoutAction

Fail = Callable[[str, str], ConfigError]

_VARIABLE = "to indicate a variable-size dimension"


def _check_identity(cfg: model_config_pb2.ModelConfig, fail: Fail) -> None:
    if not cfg.name:
        raise fail("name", "model configuration must specify 'name'")
    if cfg.platform == ENSEMBLE_PLATFORM:
        if cfg.backend:
            raise fail("backend", f"Ensemble model '{cfg.name}' must have platform type '{ENSEMBLE_PLATFORM}' and "
                                  "empty backend type")
        return
    if cfg.HasField("ensemble_scheduling"):
        raise fail(
            "ensemble_scheduling",
            f"ensemble scheduling cannot be set for model '{cfg.name}' whose platform is not {ENSEMBLE_PLATFORM}",
        )
    if not cfg.backend:
        what = f"platform '{cfg.platform}'" if cfg.platform else "no platform or model file"
        raise fail("backend", f"cannot determine the backend from {what}; set 'backend'")
    if cfg.platform == GRAPHDEF_PLATFORM:
        raise fail("platform", "TensorFlow GraphDef models (platform 'tensorflow_graphdef') are not supported by "
                               "tritond; save the model as a SavedModel ('tensorflow_savedmodel')")
    if cfg.backend not in KNOWN_BACKENDS and cfg.runtime != PYTHON_RUNTIME:
        # Triton's status text, code included, which scripts grep for
        raise fail("backend", f"Invalid argument: unable to find backend library for backend '{cfg.backend}', try "
                              f"specifying runtime on the model configuration. tritond's backends are "
                              f"{', '.join(KNOWN_BACKENDS)}")
    expected = BACKEND_PLATFORM.get(cfg.backend)
    if expected is not None and cfg.platform != expected:
        raise fail("platform", f"unexpected 'platform' and 'backend' pair, got:{cfg.platform}, {cfg.backend}")


def _check_runtime(cfg: model_config_pb2.ModelConfig, fail: Fail, backend_directory: str) -> None:
    """`runtime` names the library that runs the model. tritond runs its own backends, so the names
    it takes are the library Triton would load for the backend anyway, and model.py (a
    Python-based backend, repository/python_based.py); any other would make the model run on code
    it did not ask for."""
    runtime = cfg.runtime
    if not runtime or cfg.platform == ENSEMBLE_PLATFORM or runtime == f"libtriton_{cfg.backend}.so":
        return
    if runtime == PYTHON_RUNTIME:
        path = runtime_model_file(cfg, backend_directory)
        if not os.path.isfile(path):
            raise fail("runtime", f"unable to find Python backend based backend library '{runtime}' for model "
                                  f"'{cfg.name}', searched: '{path}'")
        return
    if _escapes(runtime):
        raise fail("runtime", f"backend library name '{runtime}' escapes backend directory, for model "
                              f"'{cfg.name}', check model config runtime field")
    raise fail("runtime", f"unable to find backend library '{runtime}' for model '{cfg.name}': tritond runs its "
                          f"own '{cfg.backend}' backend, whose library is 'libtriton_{cfg.backend}.so'")


def _check_shape(io, where: str, label: str, fail: Fail, max_batch_size: int) -> None:
    if not io.dims:
        raise fail(f"{where}.dims", f"{label} must specify 'dims'")
    if io.HasField("reshape") and not io.reshape.shape and max_batch_size == 0:
        raise fail(
            f"{where}.reshape",
            f"{label} cannot have empty reshape for non-batching model as scalar tensors are not supported",
        )
    if any(d < 1 and d != -1 for d in io.dims):
        raise fail(f"{where}.dims", f"{label} dimension must be integer >= 1, or -1 {_VARIABLE}")
    if not io.HasField("reshape"):
        return
    shape = list(io.reshape.shape)
    if any(d < 1 and d != -1 for d in shape):
        raise fail(f"{where}.reshape", f"{label} reshape dimensions must be integer >= 1, or -1 {_VARIABLE}")

    def count(dims: list[int]) -> int:
        """Triton's element count: -1 when any dimension is variable, 0 for no dimensions."""
        if not dims:
            return 0
        n = 1
        for d in dims:
            if d == -1:
                return -1
            n *= d
        return n

    dims_size, reshape_size = count(list(io.dims)), count(shape)
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        raise fail(f"{where}.reshape", f"{label} has different size for dims and reshape")
    if dims_size != -1:
        return

    def segments(dims: list[int]) -> list[int]:
        counts, n = [], 1
        for d in dims:
            if d == -1:
                counts.append(n)
                n = 1
            else:
                n *= d
        return counts + [n]

    dims, reshaped = segments(list(io.dims)), segments(shape)
    if len(dims) != len(reshaped):
        raise fail(f"{where}.reshape", f"{label} has different number of variable-size dimensions for dims and reshape")
    if dims != reshaped:
        raise fail(f"{where}.reshape", f"{label} has different size for dims and reshape")


def _check_io(cfg: model_config_pb2.ModelConfig, model_fail: Fail) -> None:
    def fail(field: str, message: str) -> ConfigError:       # Triton names the model after an I/O error
        return model_fail(field, f"{message} for {cfg.name}")

    for kind, entries in (("input", cfg.input), ("output", cfg.output)):
        seen: set[str] = set()
        for i, io in enumerate(entries):
            where = f"{kind}[{i}]"
            if not io.name:
                raise fail(f"{where}.name", f"model {kind} must specify 'name'")
            label = f"model {kind} '{io.name}'"
            if io.name in seen:
                raise fail(f"{where}.name", f"{label} is declared more than once")
            seen.add(io.name)
            if io.data_type == DataType.TYPE_INVALID:
                raise fail(f"{where}.data_type", f"{label} must specify 'data_type'")
            _check_shape(io, where, label, fail, cfg.max_batch_size)
            if io.is_shape_tensor and cfg.backend != TENSORRT:
                raise fail(f"{where}.is_shape_tensor", "shape tensors are only supported for TensorRT platform")
            if kind == "input" and io.format in (Format.FORMAT_NHWC, Format.FORMAT_NCHW) and len(io.dims) != 3:
                raise fail(f"{where}.format", "model input NHWC/NCHW require 3 dims")


def _check_dynamic_batching(cfg: model_config_pb2.ModelConfig, fail: Fail) -> None:
    db = cfg.dynamic_batching
    for i, size in enumerate(db.preferred_batch_size):
        if size <= 0:
            raise fail(
                f"dynamic_batching.preferred_batch_size[{i}]",
                f"dynamic batching preferred size must be positive for {cfg.name}",
            )
        if size > cfg.max_batch_size:
            raise fail(
                f"dynamic_batching.preferred_batch_size[{i}]",
                f"dynamic batching preferred size must be <= max batch size for {cfg.name} "
                f"({size} > {cfg.max_batch_size})",
            )
    levels = db.priority_levels
    if levels:
        if not 1 <= db.default_priority_level <= levels:
            raise fail(
                "dynamic_batching.default_priority_level", f"default priority level must be in range [1, {levels}] for {cfg.name}",
            )
        for level in db.priority_queue_policy:
            if not 1 <= level <= levels:
                raise fail(
                    f"dynamic_batching.priority_queue_policy[{level}]",
                    f"priority queue policy must have priority level in range [1, {levels}] for {cfg.name}",
                )
    if db.preserve_ordering:
        if levels > 1:
            raise fail(
                "dynamic_batching.preserve_ordering",
                f"Only one priority level is allowed when 'preserve_ordering' is true for {cfg.name}",
            )
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == TimeoutAction.DELAY for p in policies):
            raise fail(
                "dynamic_batching.preserve_ordering",
                f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {cfg.name}",
            )


def _check_ensemble(cfg: model_config_pb2.ModelConfig, fail: Fail) -> None:
    if not cfg.HasField("ensemble_scheduling"):
        raise fail(
            "ensemble_scheduling",
            f"ensemble scheduling must be set for ensemble {cfg.name} whose platform is {ENSEMBLE_PLATFORM}",
        )
    if cfg.instance_group:
        raise fail("instance_group", f"instance group should not be specified for ensemble '{cfg.name}'")
    if cfg.HasField("optimization"):
        raise fail("optimization", f"optimization should not be specified for ensemble '{cfg.name}'")
    if cfg.model_warmup:
        raise fail("model_warmup", f"model_warmup can not be specified for ensemble '{cfg.name}'")
    problem = flow_error(cfg)
    if problem:
        raise fail("ensemble_scheduling", problem)


def _check_instance_groups(cfg: model_config_pb2.ModelConfig, fail: Fail) -> None:
    if not cfg.instance_group:
        raise fail("instance_group", f"must specify one or more 'instance group's for {cfg.name}")
    gpus = devices.gpu_count()
    for i, group in enumerate(cfg.instance_group):
        where = f"instance_group[{i}]"
        label = f"instance group {group.name} of model {cfg.name}"
        if group.kind == Kind.KIND_GPU:
            if not group.gpus:
                raise fail(f"{where}.kind", f"{label} has kind KIND_GPU but no GPUs are available")
            bad = [g for g in group.gpus if not 0 <= g < gpus]
            if bad:
                # tritond does not filter GPUs by compute capability: every GPU qualifies
                listed = ", ".join(str(g) for g in range(gpus)) or "none; it has kind KIND_GPU but no GPUs are available"
                raise fail(f"{where}.gpus", f"{label} specifies invalid or unsupported gpu id {bad[0]}. GPUs with at "
                                            f"least the minimum required CUDA compute compatibility of {0.0:f} are: "
                                            + listed)
        elif group.kind in (Kind.KIND_CPU, Kind.KIND_MODEL):
            if group.gpus:
                raise fail(f"{where}.gpus", f"{label} has kind {Kind.Name(group.kind)} but specifies one or more GPUs")
        else:
            raise fail(f"{where}.kind", f"{label} has unexpected kind {Kind.Name(group.kind)}")
        if group.profile and cfg.backend != TENSORRT:
            raise fail(
                f"{where}.profile", f"{label} specifies profile field which is only supported for TensorRT models"
            )


def check_model_filenames(cfg: model_config_pb2.ModelConfig, config_file: str = "") -> None:
    """Model file names stay inside the version directory: a config can arrive over the network
    (an explicit load's `config` parameter), and a name like '../../x' would have auto-complete
    read, a worker load, or a python model execute any file the server can read."""
    def fail(field: str, message: str) -> ConfigError:
        return ConfigError(cfg.name, config_file, field, message)

    named = [("default_model_filename", cfg.default_model_filename)]
    named += [(f"cc_model_filenames[{k}]", v) for k, v in cfg.cc_model_filenames.items()]
    for field, name in named:
        if name and _escapes(name):
            raise fail(field, f"'{name}' must name a file inside the model's version directory")
    for i, out in enumerate(cfg.output):
        if out.label_filename and _escapes(out.label_filename):
            raise fail(f"output[{i}].label_filename",
                       f"'{out.label_filename}' must name a file inside the model's directory")


def _escapes(name: str) -> bool:
    return os.path.isabs(name) or ".." in name.replace("\\", "/").split("/") or "\0" in name


def _check_label_files(cfg: model_config_pb2.ModelConfig, model_path: str) -> None:
    """Triton reads each output's label file when the model loads; one it cannot read fails the load."""
    for i, out in enumerate(cfg.output):
        if out.label_filename:
            path = os.path.join(model_path, out.label_filename)
            try:
                with open(path, "rb"):
                    pass
            except OSError as e:
                raise ConfigError(cfg.name, path, f"output[{i}].label_filename",
                                  f"unable to read label file '{out.label_filename}': {e.strerror}") from None


# Triton's python backend names its stubs by the model and its instances, and refuses a name
# holding a shell metacharacter.
STUB_NAME_REFUSED = frozenset(";|&$`<>()[]{}\\\"'*?~#!")


def _check_directory_name(cfg: model_config_pb2.ModelConfig, directory: str, config_file: str) -> None:
    if directory and cfg.name != directory:
        raise UnpolledError(cfg.name, config_file, "name", f"unexpected directory name '{directory}' for model "
                                                           f"'{cfg.name}', directory name must equal model name")


def _check_model_files(cfg: model_config_pb2.ModelConfig, model_path: str, versions: list[int],
                       backend_directory: str) -> None:
    if cfg.backend == IDENTITY:     # Triton's identity backend reads no model file
        return
    if runner(cfg.backend, cfg.runtime) == PYTHON and any(
            STUB_NAME_REFUSED.intersection(name) for name in (cfg.name, *(g.name for g in cfg.instance_group))):
        raise ConfigError(cfg.name, os.path.join(model_path, "config.pbtxt"), "name",
                          "Invalid stub name: contains invalid characters")
    if cfg.runtime == PYTHON_RUNTIME:     # the backend's model.py reads what it needs of the versions
        _check_compiles(cfg.name, runtime_model_file(cfg, backend_directory))
        return
    filename = cfg.default_model_filename or DEFAULT_MODEL_FILENAME.get(cfg.backend, "")
    for v in versions:
        path = os.path.join(model_path, str(v), filename)
        if not os.path.exists(path):
            reason = (f"Failed to preinitialize Python stub: Python model file not found in '{path}'"
                      if cfg.backend == PYTHON else f"version {v} has no model file '{filename}'")
            raise ConfigError(cfg.name, path, "default_model_filename", reason)
        if cfg.backend == TENSORFLOW and not os.path.isfile(os.path.join(path, "saved_model.pb")):
            raise ConfigError(cfg.name, path, "default_model_filename",
                              f"version {v}: '{filename}' must be a SavedModel directory holding saved_model.pb")
        if cfg.backend == PYTHON and os.path.isfile(path):
            _check_compiles(cfg.name, path)


def completes_its_config(cfg: model_config_pb2.ModelConfig, model_path: str, version: int,
                         backend_directory: str = DEFAULT_BACKEND_DIRECTORY) -> bool:
    """Whether a Python model's model.py defines `auto_complete_config` (its worker completes the
    config before the inputs and outputs can be checked)."""
    if cfg.runtime == PYTHON_RUNTIME:
        path = runtime_model_file(cfg, backend_directory)
    elif cfg.backend == PYTHON:
        path = os.path.join(model_path, str(version), cfg.default_model_filename or DEFAULT_MODEL_FILENAME[PYTHON])
    else:
        return False
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "auto_complete_config"
               for node in ast.walk(tree))


def _check_compiles(model: str, path: str) -> None:
    """A model.py with a syntax error fails here, with its line, rather than in its worker."""
    try:
        with open(path, "rb") as f:
            compile(f.read(), path, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise ConfigError(model, path, "", f"does not compile: line {e.lineno}: {e.msg}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(model, path, "", f"cannot be read: {e}") from None


def validate_config(
    cfg: model_config_pb2.ModelConfig,
    *,
    model_path: str = "",
    config_file: str = "",
    versions: list[int] | None = None,
    io_pending: bool = False,
    directory: str = "",
    backend_directory: str = DEFAULT_BACKEND_DIRECTORY,
) -> None:
    """Raise ConfigError for the first problem in a normalized config.

    With `model_path`, also require the model file in each of `versions`
    (default: every version directory). `config_file` is the file errors name. With `io_pending`
    (a Python model whose auto_complete_config has yet to run) the inputs and outputs are left
    for the completed config, as Triton checks them after the backend's auto-complete. With
    `directory`, the config must name it: Triton checks that after the config and before its backend
    looks at the model files, and refuses it while polling (UnpolledError). `backend_directory`
    holds the Python-based backends.
    """

    def fail(field: str, message: str) -> ConfigError:
        return ConfigError(cfg.name, config_file, field, message)

    _check_identity(cfg, fail)
    _check_runtime(cfg, fail, backend_directory)
    check_model_filenames(cfg, config_file)
    if cfg.max_batch_size < 0:
        raise fail("max_batch_size", f"'max_batch_size' must be non-negative value for {cfg.name}")
    if not cfg.HasField("version_policy"):
        raise fail("version_policy", f"must specify 'version policy' for {cfg.name}")
    if not io_pending:
        _check_io(cfg, fail)
    if cfg.HasField("dynamic_batching"):
        _check_dynamic_batching(cfg, fail)
    if cfg.HasField("sequence_batching"):
        check_sequence_batching(cfg, fail, model_path)
    if cfg.model_transaction_policy.decoupled and cfg.response_cache.enable:
        raise fail("response_cache", f"Response Cache does not currently support model {cfg.name} with 'decoupled' "
                                     "transaction policy. Please disable the response cache.")
    check_supported(cfg, config_file)
    if cfg.model_transaction_policy.decoupled and runner(cfg.backend, cfg.runtime) not in (PYTHON, ""):
        raise fail("model_transaction_policy.decoupled", f"decoupled models are supported for the python backend "
                                                         f"only, not '{cfg.backend}'")
    if not io_pending:
        check_ragged(cfg, lambda field, message: fail(field, f"{message} for {cfg.name}"))
    check_model_metrics(cfg, fail)
    check_idempotent(cfg, fail)
    if cfg.platform == ENSEMBLE_PLATFORM:
        _check_ensemble(cfg, fail)
    else:
        _check_instance_groups(cfg, fail)
    _check_directory_name(cfg, directory, config_file)
    if model_path:
        _check_label_files(cfg, model_path)
    if cfg.platform == ENSEMBLE_PLATFORM:
        return
    check_thread_parameters(cfg, fail)
    if model_path:
        _check_model_files(cfg, model_path, version_dirs(model_path) if versions is None else versions,
                           backend_directory)
