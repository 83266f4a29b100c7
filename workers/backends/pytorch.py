"""PyTorch backend: TorchScript `model.pt` as Triton's libtorch backend loads it, and
`torch.export` programs (`model.pt2`), on the CPU or on the instance's GPU.

Tensors are bound to the model the way Triton's backend binds them:

- inputs: by the `forward` argument names when every config input names one; else by
  `<name>__<index>` when every config input follows that convention; else in config
  order. A model whose `forward` takes a single `Dict[str, Tensor]` gets the inputs
  keyed by their config names.
- outputs: by `<name>__<index>` (the element of the returned tuple) when every config
  output follows the convention, else in config order; implicit state outputs
  (`sequence_batching.state`) count among them.

`torch` is imported only here, so only a PyTorch worker pays for it. Requests of a
batch are concatenated once along the batch dimension and the outputs split back as
views. Inputs reach the model without a copy where numpy memory allows it (see
`to_tensor`). With `cuda_ipc_outputs` set, a GPU instance's outputs stay on the device
for a consumer that opens them by CUDA IPC handle (`workers/cuda_ipc.py`).
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import numpy as np

from tritond.repository.backends import PYTORCH
from tritond.repository.datatypes import CONFIG_TO_WIRE
from tritond.repository.parameters import config_parameter

from ..gpu_env import check_mps_share
from .base import Backend, WorkerRequest, WorkerResponse
from .batching import Reshapes, concat_inputs, execute_batch
from .ragged import RaggedPlan

log = logging.getLogger("tritond.worker.pytorch")

# Config data types the backend accepts, as Triton's libtorch backend does (no unsigned
# types wider than 8 bits: TorchScript has no kernels for them).
SUPPORTED_TYPES = ("TYPE_BOOL", "TYPE_UINT8", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64",
                   "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_BF16", "TYPE_STRING")

# Model config parameters read by Triton's PyTorch backend that change execution here.
PARAM_DISABLE_OPTIMIZED = "DISABLE_OPTIMIZED_EXECUTION"
PARAM_INFERENCE_MODE = "INFERENCE_MODE"
PARAM_DISABLE_CUDNN = "DISABLE_CUDNN"
PARAM_CUDA_IPC = "cuda_ipc_outputs"


def flag(config: dict, key: str, default: bool) -> bool:
    value = config_parameter(config, key).strip().lower()
    if not value:
        return default
    return value in ("true", "1", "yes", "on")


def named_index(name: str) -> int | None:
    """The index of a `<name>__<index>` tensor name, else None (Triton: text after the first '__')."""
    pos = name.find("__")
    if pos < 0:
        return None
    rest = name[pos + 2:]
    return int(rest) if rest.isdigit() else None


def input_positions(config_names: list[str], forward_args: list[str]) -> dict[str, int]:
    """Argument position of each config input under Triton's naming rules."""
    if forward_args and all(n in forward_args for n in config_names):
        return {n: forward_args.index(n) for n in config_names}
    indices = [named_index(n) for n in config_names]
    if all(i is not None for i in indices):
        return dict(zip(config_names, indices))
    log.warning("inputs %s are neither forward() arguments nor <name>__<index> names; "
                "binding them in config order", config_names)
    return {n: i for i, n in enumerate(config_names)}


def output_positions(config_names: list[str]) -> dict[str, int]:
    """Index into the model's returned tuple of each config output."""
    indices = [named_index(n) for n in config_names]
    if all(i is not None for i in indices):
        return dict(zip(config_names, indices))
    return {n: i for i, n in enumerate(config_names)}


def is_pt2(path: str) -> bool:
    return path.endswith(".pt2")


class TorchBackend(Backend):
    """One TorchScript module or exported program per worker."""
    name = PYTORCH

    def load(self) -> None:
        import torch

        self.torch = torch
        cfg = self.config
        name = self.instance.model_name
        view = self.view
        if not view.outputs:      # a config without inputs is refused by the input count, as in Triton
            raise ValueError("model configuration must contain at least one output, none were specified.")
        for kind in ("input", "output"):
            for t in cfg.get(kind) or []:           # the config's type names, as Triton's messages say them
                dtype = t.get("data_type", "TYPE_INVALID")
                if dtype not in SUPPORTED_TYPES or (kind == "output" and dtype == "TYPE_BF16"):
                    raise ValueError(f"unsupported datatype {dtype} for {kind} '{t.get('name')}' for model '{name}'")
        for ci in (cfg.get("sequence_batching") or {}).get("control_input") or []:
            for control in ci.get("control") or []:     # a typed control (CORRID) is a model input too
                dtype = control.get("data_type", "")
                if control.get("kind") == "CONTROL_SEQUENCE_CORRID" and dtype not in SUPPORTED_TYPES:
                    raise ValueError(f"input '{ci.get('name')}' type '{dtype}' is not supported by PyTorch.")
        self.batching = view.max_batch_size > 0
        self.device = self._device()
        self._threads()
        if flag(cfg, PARAM_DISABLE_CUDNN, False):
            torch.backends.cudnn.enabled = False
        self.inference_mode = flag(cfg, PARAM_INFERENCE_MODE, True)
        self.optimized = not flag(cfg, PARAM_DISABLE_OPTIMIZED, False)
        self.keep_on_device = self.device.type == "cuda" and flag(cfg, PARAM_CUDA_IPC, False)
        self.accepts_device_inputs = self.device.type == "cuda"

        path = self.model_path()
        if not os.path.isfile(path):
            raise FileNotFoundError(f"unable to find '{path}' for model instance '{self.instance.instance_name}'")
        self.exported = is_pt2(path)
        forward_args, self.dict_input = self._load_module(path)
        # A batch input is a model input too (its values come from the batch, not the request).
        batch_inputs = [(target, b.get("data_type", "TYPE_INT32")) for b in cfg.get("batch_input") or []
                        for target in b.get("target_name") or []]
        # So are a sequence model's control inputs, in config order (the view keeps them by kind),
        # and its implicit states (fed by the sequence batcher).
        seq = cfg.get("sequence_batching") or {}
        sequence_inputs = ([c["name"] for c in seq.get("control_input") or []]
                           + (view.sequence.states if view.sequence else []))
        names = list(view.inputs) + [target for target, _ in batch_inputs] + sequence_inputs
        if not self.dict_input and len(forward_args) != len(names):
            raise ValueError(f"unable to load model '{name}', configuration expects {len(names)} inputs, "
                             f"model provides {len(forward_args)}")
        self.input_pos = input_positions(names, forward_args)
        # A state output is an element of what forward returns too (by its `<name>__<index>`),
        # whether or not the config also lists it as an output.
        states = {st["output_name"]: CONFIG_TO_WIRE[st.get("data_type", "TYPE_INVALID")]
                  for st in seq.get("state") or [] if st.get("output_name") not in view.outputs}
        self.output_pos = output_positions(list(view.outputs) + list(states))
        self.output_types = {n: t.datatype for n, t in view.outputs.items()} | states
        self.input_types = {n: t.datatype for n, t in view.inputs.items()}
        self.input_types.update({target: CONFIG_TO_WIRE[dtype] for target, dtype in batch_inputs})
        self.input_types.update({st["input_name"]: CONFIG_TO_WIRE[st.get("data_type", "TYPE_INVALID")]
                                 for st in seq.get("state") or []})
        self.ragged = RaggedPlan.from_config(view, cfg)
        self.reshapes = Reshapes(view, cfg)

    def _device(self):
        torch = self.torch
        kind = self.instance.kind
        if kind == "GPU":
            check_mps_share()
            if not torch.cuda.is_available():
                raise RuntimeError("KIND_GPU instance requested but PyTorch cannot use a GPU "
                                   f"(torch {torch.__version__}: torch.cuda.is_available() is False; "
                                   "no GPU visible or a CPU-only build)")
            # CUDA_VISIBLE_DEVICES pins this worker to its instance's GPU, which it sees as cuda:0.
            return torch.device("cuda", 0)
        return torch.device("cpu")

    def _threads(self) -> None:
        torch = self.torch
        # The instance's thread budget (INTRA_OP_THREAD_COUNT / INTER_OP_THREAD_COUNT or its share
        # of the host's cores, decided at load); one thread when not budgeted (a GPU instance).
        torch.set_num_threads(self.instance.threads or 1)
        inter = self.instance.inter_op_threads
        if inter and torch.get_num_interop_threads() != inter:
            with contextlib.suppress(RuntimeError):  # only settable before the first parallel op
                torch.set_num_interop_threads(inter)

    def _load_module(self, path: str) -> tuple[list[str], bool]:
        """Load the model onto the device; returns forward()'s tensor argument names and whether
        it takes a single Dict[str, Tensor]."""
        torch = self.torch
        if self.exported:
            program = torch.export.load(path)
            signature = program.module_call_graph[0].signature
            self.module = program.module()
            if self.device.type != "cpu":
                self.module = self.module.to(self.device)
            args = list(signature.forward_arg_names if signature is not None else [])
            return args, False
        map_location = None if self.instance.kind == "MODEL" else self.device
        self.module = torch.jit.load(path, map_location=map_location)
        self.module.eval()
        arguments = list(self.module.forward.schema.arguments)
        if arguments and arguments[0].type.kind() == "ClassType":
            arguments = arguments[1:]
        if len(arguments) == 1 and arguments[0].type.kind() == "DictType":
            return [], True
        for a in arguments:
            if a.type.kind() == "DictType":
                raise ValueError("Multiple inputs of kind DictType were detected. Only a single input of "
                                 "type Dict(str, Tensor) is supported.")
            if a.type.kind() not in ("TensorType", "ListType"):
                raise ValueError(f"An input of type '{a.type}' was detected in the model. Only a single input "
                                 "of type Dict(str, Tensor) or input(s) of type Tensor are supported.")
        return [a.name for a in arguments], False

    # ------------------------------------------------------------------ execute

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        return execute_batch(requests, self._run, self.batching, self._concat, self.ragged)

    def _concat(self, requests: list[WorkerRequest]) -> tuple[dict[str, Any], list[int]]:
        """One batch from several requests: numpy inputs through concat_inputs (one host copy);
        inputs already on the device (opened by CUDA IPC) are concatenated there."""
        if all(isinstance(a, np.ndarray) for r in requests for a in r.inputs.values()):
            return concat_inputs(requests)
        names = list(requests[0].inputs)
        sizes = [len(r.inputs[names[0]]) for r in requests]
        batch = {n: self.torch.cat([self._input(n, r.inputs[n]) for r in requests]) for n in names}
        return batch, sizes

    def _run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        tensors = {name: self._input(name, arr) for name, arr in self.reshapes.model_inputs(inputs).items()}
        with self._mode():
            try:
                if self.dict_input:
                    result = self.module(tensors)
                else:
                    args: list[Any] = [None] * len(self.input_pos)
                    for name, value in tensors.items():
                        args[self.input_pos[name]] = value
                    result = self.module(*args)
            except Exception as e:
                raise RuntimeError(f"PyTorch execute failure: {e}") from e
            if isinstance(result, torch.Tensor) or (isinstance(result, list) and
                                                    all(isinstance(x, str) for x in result)):
                results = [result]
            elif isinstance(result, (tuple, list)):
                results = list(result)
            else:
                raise RuntimeError("output must be of type Tensor, List[str] or Tuple containing one of these "
                                   "two types. It should not be a List / Dictionary of Tensors or a Scalar")
            outputs: dict[str, Any] = {}
            for name, index in self.output_pos.items():
                if not 0 <= index < len(results):
                    raise RuntimeError(f"The output {name} in the model configuration refers to an output index "
                                       f"which doesn't exist. This model has {len(results)} outputs")
                outputs[name] = self._output(name, results[index])
            if self.device.type == "cuda":
                torch.cuda.current_stream().synchronize()
        return outputs

    def _mode(self):
        torch = self.torch
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode(self.inference_mode))
        stack.enter_context(torch.no_grad())
        if not self.exported:
            stack.enter_context(torch.jit.optimized_execution(self.optimized))
        return stack

    def _input(self, name: str, arr: Any):
        torch = self.torch
        if isinstance(arr, torch.Tensor):
            return arr
        if self.input_types.get(name) == "BYTES":
            return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in arr.reshape(-1)]
        if hasattr(arr, "__cuda_array_interface__"):
            tensor = torch.as_tensor(arr, device=self.device)
            return tensor.view(torch.bfloat16) if self.input_types.get(name) == "BF16" else tensor
        tensor = to_tensor(torch, arr, self.input_types.get(name))
        if self.device.type != "cpu" and tensor.device != self.device:
            tensor = tensor.to(self.device)
        return tensor

    def _output(self, name: str, value: Any) -> Any:
        torch = self.torch
        expected = self.output_types[name]
        if isinstance(value, list):
            if expected != "BYTES":
                raise RuntimeError(f"configuration expects datatype TYPE_{expected} for output '{name}', "
                                   "model provides TYPE_STRING")
            out = np.empty(len(value), dtype=np.object_)
            out[:] = [s.encode("utf-8") for s in value]
            return self.reshapes.client_outputs({name: out})[name]
        if not isinstance(value, torch.Tensor):
            raise RuntimeError(f"output '{name}' must be of type Tensor or List[str].")
        provided = TORCH_TO_WIRE.get(str(value.dtype).replace("torch.", ""), str(value.dtype))
        if provided != expected:
            raise RuntimeError(f"configuration expects datatype TYPE_{expected} for output '{name}', "
                               f"model provides TYPE_{provided}")
        if value.dim() == 0:
            raise RuntimeError(f"output '{name}' is a scalar which is not supported.")
        value = self.reshapes.client_outputs({name: value})[name]
        if self.keep_on_device:
            from tritond.workers.cuda_ipc import DeviceArray
            return DeviceArray.from_torch(value)
        return value.detach().cpu().contiguous().numpy()


# torch dtype name -> Triton wire datatype.
TORCH_TO_WIRE = {
    "bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64", "bfloat16": "BF16",
    "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
}


def to_tensor(torch, arr: np.ndarray, datatype: str | None = None):
    """A torch tensor over `arr`'s memory, without a copy when that is safe.

    torch.from_numpy shares memory, but torch assumes tensors are writable and aligned: a
    model may write into its input in place, which would fault on a read-only mapping (and
    inline request bytes are read-only). So a read-only, unaligned or non-contiguous array
    is copied once; a writable aligned view on shared memory is used in place. BF16 data
    arrives as uint16 bits and is reinterpreted, not converted.
    """
    if not (arr.flags.writeable and arr.flags.aligned and arr.flags.c_contiguous):
        arr = np.array(arr, copy=True, order="C")
    tensor = torch.from_numpy(arr)
    if datatype == "BF16":
        tensor = tensor.view(torch.bfloat16)
    return tensor
