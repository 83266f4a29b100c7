"""OpenVINO backend: an IR (`model.xml` + `model.bin`) or any file OpenVINO reads (ONNX, ...)
compiled for the CPU, as Triton's OpenVINO backend serves it.

Inputs and outputs are bound by tensor name (any of a tensor's names); the config's data
types are set on the model's input and output tensors, so OpenVINO converts where the model
differs. Triton's parameters apply: NUM_STREAMS, INFERENCE_NUM_THREADS,
COMPILATION_NUM_THREADS, PERFORMANCE_HINT, HINT_BF16, CPU_EXTENSION_PATH, TARGET_DEVICE,
RESHAPE_IO_LAYERS (input shapes from the config), SKIP_OV_DYNAMIC_BATCHSIZE and
ENABLE_BATCH_PADDING.

Batching: for a model with max_batch_size > 0 the batch dimension is made dynamic
(1..max_batch_size), so a batch formed by the dynamic batcher runs at its own size. With
SKIP_OV_DYNAMIC_BATCHSIZE=YES, or when the topology pins the batch (an output keeps a fixed
first dimension), it is fixed at max_batch_size, as Triton's backend always does: a smaller
batch is then an error unless ENABLE_BATCH_PADDING=YES pads it with zeros (and the padding is
cut from the outputs).

`openvino` is imported only here; the repository layer has checked the parameters and the
shapes (repository/openvino_autocomplete.py) before this worker started.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from tritond.repository.backends import OPENVINO, backend_record
from tritond.repository.parameters import config_parameter

from .base import Backend, WorkerRequest, WorkerResponse
from .batching import Reshapes, execute_batch

log = logging.getLogger("tritond.worker.openvino")

CONFIG_ELEMENT = {
    "TYPE_BOOL": "boolean", "TYPE_UINT8": "u8", "TYPE_UINT16": "u16", "TYPE_UINT32": "u32", "TYPE_UINT64": "u64",
    "TYPE_INT8": "i8", "TYPE_INT16": "i16", "TYPE_INT32": "i32", "TYPE_INT64": "i64", "TYPE_FP16": "f16",
    "TYPE_FP32": "f32",
}


def import_openvino() -> Any:
    try:
        import openvino
    except ImportError as e:
        raise RuntimeError("the OpenVINO backend needs the 'openvino' Python package, which is not installed "
                           f"here ({backend_record(OPENVINO).install_hint}): {e}") from None
    return openvino


def yes(config: dict, key: str) -> bool:
    return config_parameter(config, key).strip().upper() == "YES"


def compile_properties(ov: Any, config: dict, batching: bool = False, skip_dynamic: bool = False,
                       threads: int = 0) -> dict:
    """Triton's OpenVINO parameters as OpenVINO properties (values were checked at config load);
    `threads`: the instance's thread budget (INFERENCE_NUM_THREADS or its share of the host's
    cores, decided at load), which INFERENCE_NUM_THREADS below confirms."""
    props = ov.properties
    out: dict = {props.hint.allow_auto_batching: batching and not skip_dynamic}
    if threads:
        out[props.inference_num_threads] = threads
    for key, prop in (("INFERENCE_NUM_THREADS", props.inference_num_threads),
                      ("COMPILATION_NUM_THREADS", props.compilation_num_threads)):
        value = config_parameter(config, key).strip()
        if value:
            out[prop] = int(value)
    streams = config_parameter(config, "NUM_STREAMS").strip().upper()
    if streams:
        num = props.streams.Num
        out[props.streams.num] = num.AUTO if streams == "AUTO" else num.NUMA if streams == "NUMA" else num(int(streams))
    hint = config_parameter(config, "PERFORMANCE_HINT").strip().upper()
    if hint:
        out[props.hint.performance_mode] = getattr(props.hint.PerformanceMode, hint)
    # Full precision unless HINT_BF16 asks for less: OpenVINO would otherwise pick bf16 on CPUs
    # with AMX or AVX512-BF16, and results would depend on the machine.
    out[props.hint.inference_precision] = ov.Type.bf16 if yes(config, "HINT_BF16") else ov.Type.f32
    return out


class OpenVINOBackend(Backend):
    """One compiled model and one infer request per worker."""
    name = OPENVINO

    def load(self) -> None:
        ov = import_openvino()
        cfg = self.config
        if self.instance.kind != "CPU":
            raise RuntimeError(f"unable to load model '{self.instance.model_name}', Triton OpenVINO backend "
                               "supports only Kind CPU and AUTO")
        core = ov.Core()
        extension = config_parameter(cfg, "CPU_EXTENSION_PATH").strip()
        if extension:
            core.add_extension(extension)
        path = self.model_path()
        if not os.path.exists(path):
            raise FileNotFoundError(f"unable to find '{path}' for model '{self.instance.model_name}'")
        model = core.read_model(path)
        self.max_batch = self.view.max_batch_size
        self.reshapes = Reshapes(self.view, cfg)
        self.batching = self.reshapes.batching
        self.static_batch = self.batching and yes(cfg, "SKIP_OV_DYNAMIC_BATCHSIZE")
        self.padding = yes(cfg, "ENABLE_BATCH_PADDING")
        model = self._prepare(ov, model)
        device = config_parameter(cfg, "TARGET_DEVICE").strip().upper() or "CPU"
        props = compile_properties(ov, cfg, self.batching, self.static_batch, self.instance.threads)
        self.compiled = core.compile_model(model, device, props)
        self.request = self.compiled.create_infer_request()
        self.outputs = [(name, self.compiled.output(name)) for name in self.view.outputs]

    def _prepare(self, ov: Any, model: Any) -> Any:
        """Bind the config's names and types, reshape where asked, and set the batch dimension."""
        cfg = self.config
        known = {n for port in model.inputs for n in port.get_names()}
        ppp = ov.preprocess.PrePostProcessor(model)
        shapes = {}
        for io in cfg.get("input") or []:
            name = io["name"]
            if name not in known:
                raise ValueError(f"unexpected inference input '{name}' for model '{self.instance.model_name}'")
            ppp.input(name).tensor().set_element_type(getattr(ov.Type, CONFIG_ELEMENT[io["data_type"]]))
            if yes(cfg, "RESHAPE_IO_LAYERS"):
                dims = list(io["reshape"].get("shape") or []) if "reshape" in io else list(io["dims"])
                shapes[model.input(name).get_any_name()] = ov.PartialShape(([-1] if self.batching else []) + [int(d) for d in dims])
        for io in cfg.get("output") or []:
            ppp.output(io["name"]).tensor().set_element_type(getattr(ov.Type, CONFIG_ELEMENT[io["data_type"]]))
        model = ppp.build()
        if self.batching:
            for port in model.inputs:
                shape = shapes.get(port.get_any_name(), port.get_partial_shape())
                if shape.rank.is_dynamic or len(shape) == 0:
                    raise ValueError(f"input '{port.get_any_name()}' has no batch dimension but max_batch_size is "
                                     f"{self.max_batch}")
                shape[0] = ov.Dimension(self.max_batch) if self.static_batch else ov.Dimension(1, self.max_batch)
                shapes[port.get_any_name()] = shape
        if shapes:
            try:
                model.reshape({model.input(name): shape for name, shape in shapes.items()})
            except Exception as e:
                hint = "" if self.static_batch else "; try parameter SKIP_OV_DYNAMIC_BATCHSIZE=YES"
                raise ValueError(f"model '{self.instance.model_name}' cannot take the configured shapes: "
                                 f"{e}{hint}") from None
        if self.batching and not self.static_batch and any(
                o.get_partial_shape().rank.is_static and len(o.get_partial_shape()) and
                o.get_partial_shape()[0].is_static for o in model.outputs):
            # The topology pins the batch (e.g. a Reshape to a constant shape): run it as Triton's
            # backend runs every model, at max_batch_size.
            log.warning("model '%s' cannot take a dynamic batch; its batch is fixed at max_batch_size %d",
                        self.instance.model_name, self.max_batch)
            self.static_batch = True
            model.reshape({port: [self.max_batch, *list(port.get_partial_shape())[1:]] for port in model.inputs})
        return model

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        return execute_batch(requests, self._run, self.batching)

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs = self.reshapes.model_inputs(inputs)
        size = next(iter(inputs.values())).shape[0] if self.batching and inputs else 0
        pad = 0
        if self.static_batch and size != self.max_batch:
            if not self.padding:
                raise ValueError(f"expected requests with batch size '{self.max_batch}', got '{size}'... this error "
                                 "can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in model configuration "
                                 "to 'YES' at a performance cost.")
            pad = self.max_batch - size
            inputs = {n: np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)]) for n, a in inputs.items()}
        result = self.request.infer({n: np.ascontiguousarray(a) for n, a in inputs.items()},
                                    share_inputs=True, share_outputs=True)
        outputs = {name: result[port] for name, port in self.outputs}
        if pad:
            outputs = {n: a[:size] for n, a in outputs.items()}
        return self.reshapes.client_outputs(outputs)
