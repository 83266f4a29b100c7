"""The TensorFlow backend's auto-complete and checks for SavedModels, from the signature.

As Triton's TensorFlow backend: inputs and outputs are the serving signature's keys (not
the graph's tensor names); auto-complete fills `max_batch_size` (when every signature
tensor has a free first dimension), adds `dynamic_batching {}`, completes listed inputs and
outputs and adds unlisted inputs (and all outputs when none is listed). The signature is
read from `saved_model.pb` (see savedmodel.py), so none of this imports TensorFlow and a
mismatch is a located config error before any worker starts.
"""
from __future__ import annotations

from typing import Callable

from tritonclient.grpc import model_config_pb2

from .errors import ConfigError
from .parameters import int_parameter, parameter_text
from .savedmodel import DTYPE_CONFIG, Signature, SignatureTensor, read_signature

DataType = model_config_pb2.DataType
Fail = Callable[[str, str], ConfigError]

PARAM_INTRA = "TF_NUM_INTRA_THREADS"
PARAM_INTER = "TF_NUM_INTER_THREADS"
PARAM_PER_SESSION = "TF_USE_PER_SESSION_THREADS"
PARAM_TAG = "TF_GRAPH_TAG"
PARAM_SIGNATURE = "TF_SIGNATURE_DEF"
PARAM_SHARE = "MAX_SESSION_SHARE_COUNT"
PARAM_INIT_OPS = "TF_INIT_OPS_FILE"

SUPPORTED_TYPES = frozenset(DTYPE_CONFIG.values())


def _shape(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _rank(t: SignatureTensor) -> int:
    return len(t.dims) if t.dims else 0


def _configured_dims(io) -> list[int]:
    return list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)


def check_parameters(cfg: model_config_pb2.ModelConfig, fail: Fail) -> None:
    """Triton's TensorFlow model parameters: values checked, the unservable ones refused."""
    for key in (PARAM_INTRA, PARAM_INTER):
        value = int_parameter(cfg, key, fail)
        if value is not None and value < 0:
            raise fail(f"parameters.{key}", f"parameter '{key}' must be non-negative number for TensorFlow "
                                            f"model '{cfg.name}'")
    share = int_parameter(cfg, PARAM_SHARE, fail)
    if share is not None and share <= 0:
        raise fail(f"parameters.{PARAM_SHARE}", f"parameter '{PARAM_SHARE}' must be positive number for "
                                                f"TensorFlow model '{cfg.name}'")
    if share is not None and share > 1:
        raise fail(f"parameters.{PARAM_SHARE}", "tritond runs every model instance in its own process, so "
                                                "instances cannot share a TensorFlow session; remove the "
                                                "parameter or set it to 1")
    if parameter_text(cfg, PARAM_INIT_OPS):
        raise fail(f"parameters.{PARAM_INIT_OPS}", "initialization-op files are not supported by tritond "
                                                   "(a SavedModel runs its own initializers)")
    graph = cfg.optimization.graph
    if graph.level:
        raise fail("optimization.graph.level", "TensorFlow graph optimization levels (XLA) are not supported "
                                               "by tritond")
    accelerators = cfg.optimization.execution_accelerators
    for kind in ("gpu_execution_accelerator", "cpu_execution_accelerator"):
        for i, accelerator in enumerate(getattr(accelerators, kind)):
            raise fail(f"optimization.execution_accelerators.{kind}[{i}]",
                       f"execution accelerator '{accelerator.name}' is not supported for TensorFlow models "
                       "by tritond")


def _fix_batching(cfg, sig: Signature, default_max_batch_size: int, fail: Fail) -> bool:
    """Triton's FixBatchingSupport: returns whether the filled dims leave out a batch dimension."""
    tensors = sig.inputs + sig.outputs
    sig_batches = all(_rank(t) == 0 or t.dims[0] == -1 for t in tensors)
    if not sig_batches and cfg.max_batch_size > 0:
        raise fail("max_batch_size", f"unable to autofill for '{cfg.name}', configuration specified max-batch "
                                     f"{cfg.max_batch_size} but model signature does not support batching")
    hint = False
    if sig_batches:
        if cfg.input or cfg.output:
            explicit = None
            for entries, model in ((cfg.input, sig.inputs), (cfg.output, sig.outputs)):
                by_key = {t.key: t for t in model}
                for io in entries:
                    t = by_key.get(io.name)
                    if t is None or _rank(t) == 0:
                        continue
                    dims = _configured_dims(io)
                    if not dims:
                        hint = hint or explicit is None
                        continue
                    says_batch = len(dims) == _rank(t) - 1
                    if explicit is not None and explicit != says_batch:
                        raise fail("max_batch_size", f"unable to autofill for '{cfg.name}', model tensor "
                                                     "configurations are contradicting each other in terms "
                                                     "of whether batching is supported")
                    explicit, hint = says_batch, says_batch
        else:
            hint = True
    batching = hint and default_max_batch_size > 0
    if cfg.max_batch_size == 0 and batching:
        cfg.max_batch_size = default_max_batch_size
    if cfg.max_batch_size > 1 and cfg.WhichOneof("scheduling_choice") is None:
        cfg.dynamic_batching.SetInParent()
    return batching


def _fill(io, t: SignatureTensor, batching: bool, fail: Fail, field: str, cfg_name: str) -> None:
    if not io.name:
        io.name = t.key
    if io.data_type == DataType.TYPE_INVALID and t.config_type != "TYPE_INVALID":
        io.data_type = DataType.Value(t.config_type)
    if io.dims:
        return
    if _rank(t) == 0:
        raise fail(field, f"Unable to autofill for '{cfg_name}': the rank of model tensor '{t.key}' is 0 and "
                          "dimensions are not defined")
    dims = t.dims[1:] if batching else list(t.dims)
    if not dims:
        dims = [1]
        io.reshape.SetInParent()
    io.dims.extend(dims)


def _complete(cfg, sig: Signature, default_max_batch_size: int, fail: Fail) -> None:
    batching = _fix_batching(cfg, sig, default_max_batch_size, fail)
    by_key = {t.key: t for t in sig.inputs}
    listed = {io.name for io in cfg.input} | {n for b in cfg.batch_input for n in b.target_name}
    for i, io in enumerate(cfg.input):
        if io.name in by_key:
            _fill(io, by_key[io.name], batching, fail, f"input[{i}].dims", cfg.name)
    for t in sig.inputs:
        if t.key not in listed:
            _fill(cfg.input.add(), t, batching, fail, f"input[{len(cfg.input) - 1}].dims", cfg.name)
    outputs = {t.key: t for t in sig.outputs}
    if not cfg.output:
        for t in sig.outputs:
            if _rank(t) == 0:
                raise fail("output", f"Unable to autofill for '{cfg.name}': the rank of model tensor '{t.key}' "
                                     "is 0 which is not supported")
            _fill(cfg.output.add(), t, batching, fail, f"output[{len(cfg.output) - 1}].dims", cfg.name)
        return
    for i, io in enumerate(cfg.output):
        if io.name in outputs:
            _fill(io, outputs[io.name], batching, fail, f"output[{i}].dims", cfg.name)


def _compare_dims(cfg, io, t: SignatureTensor, field: str, exact: bool, fail: Fail) -> None:
    if _rank(t) == 0:
        return   # the signature leaves the shape open: the config's dims stand
    dims = _configured_dims(io)
    model = list(t.dims)
    if cfg.max_batch_size > 0:
        if model[0] != -1:
            raise fail(field, f"model '{cfg.name}', tensor '{io.name}': for the model to support batching the "
                              "shape should have at least 1 dimension and the first dimension must be -1; but "
                              f"shape expected by the model is {_shape(model)}")
        full = [-1] + dims
        note = (" dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit "
                f"tensor shape, making complete shape {_shape(full)})")
    else:
        full = dims
        note = f" dimensions (shape {_shape(full)})"
    ok = len(model) == len(full) and all(exact and m == c or not exact and (m == -1 or m == c)
                                         for m, c in zip(model, full))
    if not ok:
        raise fail(field, f"model '{cfg.name}', tensor '{io.name}': the model expects {len(model)} dimensions "
                          f"(shape {_shape(model)}) but the model configuration specifies {len(full)}{note}")


def _check(cfg, sig: Signature, fail: Fail) -> None:
    """Triton's ValidateTRITONTFModel for SavedModels, one located error at a time."""
    for kind, tensors in (("input", sig.inputs), ("output", sig.outputs)):
        for t in tensors:
            if t.config_type == "TYPE_INVALID":
                raise fail(kind, f"unable to process {kind} '{t.key}' for '{cfg.name}', unsupported datatype "
                                 f"'{t.dtype_name}'")
    for kind, entries, tensors in (("input", cfg.input, sig.inputs), ("output", cfg.output, sig.outputs)):
        by_key = {t.key: t for t in tensors}
        for i, io in enumerate(entries):
            t = by_key.get(io.name)
            if t is None:
                allowed = ", ".join(sorted(by_key))
                raise fail(f"{kind}[{i}].name", f"unexpected inference {kind} '{io.name}', allowed {kind}s are: "
                                                f"{allowed}")
            if DataType.Name(io.data_type) not in SUPPORTED_TYPES:
                raise fail(f"{kind}[{i}].data_type", f"unsupported datatype '{DataType.Name(io.data_type)}' for "
                                                     f"tensor '{io.name}' for model '{cfg.name}'")
            if kind == "input" and io.allow_ragged_batch:
                raise fail(f"{kind}[{i}].allow_ragged_batch", "ragged batching is not supported by tritond")
            _compare_dims(cfg, io, t, f"{kind}[{i}].dims", kind == "output", fail)
            if DataType.Name(io.data_type) != t.config_type:
                raise fail(f"{kind}[{i}].data_type", f"unable to load model '{cfg.name}', configuration expects "
                                                     f"datatype {DataType.Name(io.data_type)} for {kind} "
                                                     f"'{io.name}', model provides {t.config_type}")
        if kind == "input":
            expected = len(cfg.input) + len(cfg.batch_input)
            if expected != len(tensors):
                raise fail("input", f"unable to load model '{cfg.name}', configuration expects {expected} inputs, "
                                    f"model provides {len(tensors)}")


def autocomplete_savedmodel(
    cfg: model_config_pb2.ModelConfig, model_dir: str, config_file: str, default_max_batch_size: int,
    fill: bool = True,
) -> None:
    """Complete `cfg` from the SavedModel at `model_dir` (with `fill`) and check it against the
    served signature. Raises ConfigError."""

    def fail(field: str, message: str) -> ConfigError:
        return ConfigError(cfg.name, config_file, field, message)

    check_parameters(cfg, fail)
    tag, signature = parameter_text(cfg, PARAM_TAG), parameter_text(cfg, PARAM_SIGNATURE)
    try:
        sig = read_signature(model_dir, tag, signature)
    except ValueError as e:
        if "signature" in str(e):
            raise fail(f"parameters.{PARAM_SIGNATURE}", str(e)) from None
        tagged = "tagged" in str(e)
        raise ConfigError(cfg.name, config_file if tagged else model_dir,
                          f"parameters.{PARAM_TAG}" if tagged else "default_model_filename", str(e)) from None
    except Exception as e:  # protobuf DecodeError, OSError: not a SavedModel
        raise ConfigError(cfg.name, model_dir, "default_model_filename", f"cannot read the SavedModel: {e}") from None
    if fill:
        _complete(cfg, sig, default_max_batch_size, fail)
    _check(cfg, sig, fail)
