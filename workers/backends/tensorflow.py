"""TensorFlow backend: a SavedModel (`model.savedmodel/`) served through one of its signatures,
as Triton's TensorFlow backend serves it.

The graph is chosen by the parameter TF_GRAPH_TAG (default `serve`), the signature by
TF_SIGNATURE_DEF (default `serving_default`, else the first non-reserved one), and inputs and
outputs are bound by the signature's keys. TF_NUM_INTRA_THREADS and TF_NUM_INTER_THREADS set
TensorFlow's thread pools; every instance is its own process, so its pools are its own (what
TF_USE_PER_SESSION_THREADS asks for). A KIND_GPU instance places the model on its GPU (seen
as GPU:0 through CUDA_VISIBLE_DEVICES); a CPU instance hides the GPUs from TensorFlow so it
never takes GPU memory.

TensorFlow is imported only in this worker, never in the broker or the frontends.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from tritond.repository.backends import TENSORFLOW, backend_record
from tritond.repository.parameters import config_parameter
from tritond.repository.savedmodel import SERVE_TAG, select_signature
from tritond.repository.tensorflow_autocomplete import PARAM_SIGNATURE, PARAM_TAG

from .. import native_stderr
from ..gpu_env import check_mps_share
from .base import Backend, WorkerRequest, WorkerResponse
from .batching import Reshapes, execute_batch


def import_tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TensorFlow's start-up chatter off the server log
    try:
        import tensorflow
    except ImportError as e:
        hint = backend_record(TENSORFLOW).install_hint
        raise RuntimeError("the TensorFlow backend needs the 'tensorflow' Python package (tensorflow-cpu will "
                           f"do), which is not installed here ({hint}): {e}") from None
    return tensorflow


class TensorFlowBackend(Backend):
    """One loaded SavedModel signature per worker."""
    name = TENSORFLOW

    def load(self) -> None:
        if self.instance.kind == "GPU":
            check_mps_share()
        with native_stderr.captured("TensorFlow"):
            tf = self.tf = import_tensorflow()
        cfg = self.config
        # The instance's thread budget (TF_NUM_INTRA_THREADS / TF_NUM_INTER_THREADS or its share
        # of the host's cores, decided at load); TensorFlow's defaults when not budgeted.
        for count, setter in ((self.instance.threads, tf.config.threading.set_intra_op_parallelism_threads),
                              (self.instance.inter_op_threads, tf.config.threading.set_inter_op_parallelism_threads)):
            if count:
                setter(count)
        self.device = self._device()
        path = self.model_path()
        tag = config_parameter(cfg, PARAM_TAG).strip() or SERVE_TAG
        with tf.device(self.device), native_stderr.captured("TensorFlow"):
            self.model = tf.saved_model.load(path, tags=[tag])
        configured = config_parameter(cfg, PARAM_SIGNATURE).strip()
        name = select_signature(list(self.model.signatures.keys()), configured)
        if name is None:
            raise ValueError(f"unable to load model '{self.instance.model_name}', expected "
                             f"'{configured or 'serving_default'}' signature")
        self.function = self.model.signatures[name]
        self.input_specs = dict(self.function.structured_input_signature[1])
        self.output_names = list(self.view.outputs)
        self.reshapes = Reshapes(self.view, cfg)
        self.batching = self.reshapes.batching

    def _device(self) -> str:
        tf = self.tf
        if self.instance.kind == "GPU":
            if not tf.config.list_physical_devices("GPU"):
                raise RuntimeError("KIND_GPU instance requested but TensorFlow sees no GPU (no GPU visible, or a "
                                   "CPU-only build such as tensorflow-cpu)")
            return "/GPU:0"
        tf.config.set_visible_devices([], "GPU")
        return "/CPU:0"

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        return execute_batch(requests, self._run, self.batching)

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = self.tf
        feed = {}
        for name, arr in self.reshapes.model_inputs(inputs).items():
            feed[name] = tf.constant(arr, dtype=self.input_specs[name].dtype)
        with tf.device(self.device):
            result = self.function(**feed)
        return self.reshapes.client_outputs({name: result[name].numpy() for name in self.output_names})
