"""Runs a Triton Python-backend model (model.py with TritonPythonModel) inside a worker.

The worker process plays the part of Triton's stub: it imports model.py with pb_utils
installed under Triton's module name, hands it pb_utils requests and turns the returned
InferenceResponses back into numpy outputs.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.machinery
import importlib.util
import inspect
import itertools
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from tritond.repository.backends import PYTHON, PYTHON_RUNTIME
from tritond.wire.errors import Code, TritonError, internal, invalid
from tritond.wire.schema import ModelView
from tritond.workers import pb_utils
from tritond.workers.backends.base import Backend, InstanceInfo, WorkerRequest, WorkerResponse
from tritond.workers.model_errors import ModelError, describe

log = logging.getLogger("tritond.worker")

_module_ids = itertools.count()


class PythonBackend(Backend):
    """One TritonPythonModel instance; async execute() runs on a loop owned by the backend."""
    name = PYTHON

    def __init__(self, config: dict, view: ModelView, instance: InstanceInfo) -> None:
        super().__init__(config, view, instance)
        self._decoupled = False
        self._module: ModuleType | None = None
        self._model: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._all_outputs: list[str] = []
        self._bf16_inputs: frozenset[str] = frozenset()
        self._iterative = False

    def model_path(self) -> str:
        """model.py: the version's, or a Python-based backend's own (as Triton's stub runs it)."""
        if self.instance.runtime_dir:
            return os.path.join(self.instance.runtime_dir, PYTHON_RUNTIME)
        return super().model_path()

    def _import_model(self) -> ModuleType:
        """Import model.py once, under a name unique to this load so reloads get fresh code."""
        if self._module is not None:
            return self._module
        path = self.model_path()
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Python model file not found in '{path}'")
        sys.modules["triton_python_backend_utils"] = pb_utils
        sys.argv = [""]         # as in Triton's stub, an embedded interpreter (unittest.main() reads it)
        pb_utils.set_model_dir(self.instance.version_dir)
        for folder in filter(None, (self.instance.model_dir, self.instance.version_dir, self.instance.runtime_dir)):
            if folder not in sys.path:
                sys.path.insert(0, folder)
        safe_name = re.sub(r"\W", "_", self.instance.model_name)
        package = f"tritond_model_{safe_name}_{self.instance.model_version}_{next(_module_ids)}"
        module_name = f"{package}.{os.path.splitext(os.path.basename(path))[0]}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = _version_package(package, self.instance.version_dir)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            _forget(package)
            raise ModelError(describe(e)) from e
        except BaseException:
            _forget(package)
            raise
        if not inspect.isclass(getattr(module, "TritonPythonModel", None)):
            raise AttributeError(f"Python model '{path}' does not define class TritonPythonModel")
        self._module = module
        return module

    def auto_complete(self) -> dict | None:
        """Config completed by TritonPythonModel.auto_complete_config, or None without that hook."""
        hook = getattr(self._import_model().TritonPythonModel, "auto_complete_config", None)
        if hook is None:
            return None
        completed = self._run_model_code(hook, pb_utils.ModelConfig(self.config))
        if not isinstance(completed, pb_utils.ModelConfig):
            raise TypeError(
                f"auto_complete_config function in model '{self.instance.model_name}' "
                "must return a valid pb.ModelConfig object.")
        return completed.as_dict()

    def load(self) -> None:
        self._decoupled = self.view.decoupled
        self._all_outputs = list(self.view.outputs)
        self._iterative = self.view.sequence is not None and self.view.sequence.iterative
        self._bf16_inputs = frozenset(n for n, t in self.view.inputs.items() if t.datatype == "BF16")
        self._model = self._run_model_code(self._import_model().TritonPythonModel)
        if hasattr(self._model, "initialize"):
            info = self.instance
            with _bls_refused():
                self._run_model_code(self._model.initialize, {
                    "model_config": json.dumps(self.config),
                    "model_instance_kind": info.kind,
                    "model_instance_name": info.instance_name,
                    "model_instance_device_id": str(info.device_id),
                    "model_repository": info.model_dir,
                    "model_version": str(info.model_version),
                    "model_name": info.model_name,
                })

    def ready_hook(self) -> bool:
        return hasattr(self._model, "is_ready")

    def is_ready(self) -> tuple[bool, str]:
        """Triton's stub's call of is_ready() (awaited when it is a coroutine)."""
        try:
            ready = self._call(self._model.is_ready)
        except Exception as e:
            return False, describe(e)
        if not isinstance(ready, bool):
            return False, "is_ready() must return a boolean value"
        return ready, "" if ready else "user-defined check failed"

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        if not hasattr(self._model, "execute"):
            raise pb_utils.TritonModelException(
                f"Python model {self.model_path()} does not implement `execute` method.")
        if self._decoupled:
            self._execute_decoupled([self._to_pb_request(r) for r in requests])
            return []
        sent = _Sent(len(requests))
        pb_requests = [self._to_pb_request(r, functools.partial(sent.keep, i)) for i, r in enumerate(requests)]
        again: set[int] = set()
        try:
            returned = self._call(self._model.execute, pb_requests)
            problem = _check_responses(returned, len(pb_requests))
            again = _released_to_run_again(pb_requests)
            if problem is None and again:
                problem = _check_rescheduled(returned, again)
        except MemoryError:
            raise
        except Exception as e:
            returned, problem = None, describe(e)
        if problem is None:
            problem = sent.settle(pb_requests, returned or [None] * len(pb_requests), again)
        for r in pb_requests:
            r._response_sender.close()
        self.rescheduled = tuple(sorted(again)) if self._iterative and problem is None else ()
        message = self._failed(problem) if problem is not None else ""
        out = [_to_worker_response(resp, req) if resp is not None else WorkerResponse(error=internal(message))
               for resp, req in zip(sent.responses, pb_requests)]
        for i in again if problem is None else ():
            out[i] = WorkerResponse() if self._iterative else WorkerResponse(error=invalid(RESCHEDULE_REFUSED))
        return out

    def _failed(self, problem: str) -> str:
        """Triton's text for requests the model failed, logged as an error as Triton logs it."""
        message = f"Failed to process the request(s) for model '{self.instance.instance_name}', message: {problem}"
        log.error("%s", message)
        return message

    def close(self) -> None:
        try:
            if self._model is not None and hasattr(self._model, "finalize"):
                with _bls_refused():
                    self._call(self._model.finalize)
        finally:
            self._model = None
            self._stop_loop()

    def _execute_decoupled(self, pb_requests: list[pb_utils.InferenceRequest]) -> None:
        """The model answers through the response senders, now or later from its own threads;
        an async execute() runs on in the background. If it fails, every request it has not
        finished gets the error as its final response."""
        def fail(problem: str) -> None:
            error = pb_utils.TritonError(self._failed(problem))
            for r in pb_requests:
                sender = r.get_response_sender()
                if not sender.is_closed():
                    try:
                        sender.send(pb_utils.InferenceResponse(error=error),
                                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    except pb_utils.TritonModelException:
                        pass        # closed meanwhile by the model's own thread

        self.rescheduled = ()
        try:
            result = self._model.execute(pb_requests)
            again = _released_to_run_again(pb_requests)
            if again and self._iterative:
                self.rescheduled = tuple(sorted(again))
            for i in again if not self._iterative else ():
                sender = pb_requests[i].get_response_sender()
                if not sender.is_closed():
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        RESCHEDULE_REFUSED, pb_utils.TritonError.INVALID_ARG)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if inspect.iscoroutine(result):
                future = asyncio.run_coroutine_threadsafe(result, self._event_loop())
                future.add_done_callback(
                    lambda f: f.cancelled() or f.exception() is None or fail(describe(f.exception())))
            elif result is not None:
                fail(f"Python model '{self.instance.instance_name}' is using the decoupled mode and the execute "
                     f"function must return None.")
        except MemoryError:
            raise
        except Exception as exc:
            fail(describe(exc))

    def _to_pb_request(self, request: WorkerRequest, collect: Any = None) -> pb_utils.InferenceRequest:
        # Triton's core treats "no outputs requested" as "every configured output".
        bf16 = self._bf16_inputs
        pb_request = pb_utils.InferenceRequest(
            request.request_id, request.correlation_id,
            inputs=[pb_utils.Tensor.bf16(name, array) if bf16 and name in bf16 else pb_utils.Tensor(name, array)
                    for name, array in request.inputs.items()],
            requested_output_names=request.requested_outputs or self._all_outputs,
            model_name=self.instance.model_name, model_version=self.instance.model_version,
            flags=request.flags, timeout=request.timeout_us,
            trace=pb_utils.InferenceTrace(request.trace.id, request.trace.context) if request.trace else None,
        )
        if request.parameters:      # a client's may hold doubles, which a model's own may not
            pb_request._parameters = json.dumps(request.parameters)
        responder = request.responder
        if responder is not None:
            is_cancelled = pb_request._cancelled = responder.is_cancelled
        else:
            is_cancelled = _never
        pb_request._response_sender = pb_utils.ResponseSender(
            collect or _deliver(responder, pb_request), self._decoupled, is_cancelled)
        return pb_request

    def _run_model_code(self, fn: Any, *args: Any) -> Any:
        """Call a model hook at load; what it raises becomes a ModelError in Triton's words."""
        try:
            return self._call(fn, *args)
        except MemoryError:
            raise
        except Exception as e:
            raise ModelError(describe(e)) from e

    def _call(self, fn: Any, *args: Any) -> Any:
        """Call a model hook; a coroutine result is awaited on the backend's event loop."""
        result = fn(*args)
        if not inspect.iscoroutine(result):
            return result
        return asyncio.run_coroutine_threadsafe(result, self._event_loop()).result()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, name=f"{self.instance.instance_name}-asyncio", daemon=True)
            self._loop_thread.start()
        return self._loop

    def _stop_loop(self) -> None:
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join()
        self._loop.close()
        self._loop = self._loop_thread = None


def _refuse_bls(*_args: Any) -> Any:
    raise pb_utils.TritonModelException("BLS is only supported during the 'execute' function.")


@contextlib.contextmanager
def _bls_refused() -> Iterator[None]:
    """Triton's stub refuses BLS calls while the model initializes or finalizes."""
    installed = pb_utils._bls_handler, pb_utils._bls_stream_handler
    pb_utils.set_bls_handler(_refuse_bls, _refuse_bls)
    try:
        yield
    finally:
        pb_utils.set_bls_handler(*installed)


def _version_package(name: str, version_dir: str) -> ModuleType:
    """The version directory as a package holding model.py, as Triton's stub imports it
    (`<version>.model`), so a model's relative imports (`from . import helper`) resolve."""
    package = ModuleType(name)
    package.__path__ = [version_dir]
    package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    package.__spec__.submodule_search_locations = [version_dir]
    return package


def _forget(package: str) -> None:
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]


class _Sent:
    """A non-decoupled batch's answers, as Triton's stub takes them: a response sent through the
    request's sender (during execute() or, from another thread, after it) is the request's answer;
    one execute() returns counts only for a request not answered so."""

    def __init__(self, count: int) -> None:
        self.responses: list[pb_utils.InferenceResponse | None] = [None] * count
        self._cond = threading.Condition()

    def keep(self, index: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if response is not None:
            with self._cond:
                self.responses[index] = response
                self._cond.notify_all()

    def settle(self, requests: list[pb_utils.InferenceRequest], returned: list, again: set[int]) -> str | None:
        """Take the returned responses, then wait for those the model still owes through a sender
        it took (until the request is cancelled); a request nobody can answer is an error (one
        released to run again is answered later)."""
        with self._cond:
            for i, response in enumerate(returned):
                if self.responses[i] is None:
                    self.responses[i] = response
            for i, request in enumerate(requests):
                while (self.responses[i] is None and i not in again and request._sender_taken
                       and not request.is_cancelled()):
                    self._cond.wait(0.1)
        if any(r is None for i, r in enumerate(self.responses) if i not in again):
            return ("Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{type(None)}'.")
        return None


RESCHEDULE_REFUSED = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                      "configured to handle such a flag.")


def _released_to_run_again(requests: list[pb_utils.InferenceRequest]) -> set[int]:
    """The requests the model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE (looked for
    only when it set release flags at all)."""
    if not pb_utils.release_flags_set:
        return set()
    pb_utils.release_flags_set = False
    return {i for i, r in enumerate(requests) if r._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE}


def _check_rescheduled(responses: list | None, again: set[int]) -> str | None:
    """Triton's stub's check: a rescheduled request's place in execute()'s list holds None."""
    for i in sorted(again):
        if responses is not None and responses[i] is not None:
            return ("Expected a None object in the execute function return list for reschduled request, found "
                    f"type '{type(responses[i])}'.")
    return None


def _check_responses(responses: Any, count: int) -> str | None:
    """Why execute()'s return value is unusable (Triton's wording), or None; None (every request
    answered through its response sender) is usable."""
    if responses is None:
        return None
    if not isinstance(responses, list):
        return f"Expected a list in the execute return, found type '{type(responses)}'."
    if len(responses) != count:
        return ("Number of InferenceResponse objects do not match the number of InferenceRequest "
                f"objects. InferenceRequest(s) size is:{count}, and InferenceResponse(s) size "
                f"is:{len(responses)}")
    for response in responses:
        if response is not None and not isinstance(response, pb_utils.InferenceResponse):
            return ("Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{type(response)}'.")
    return None


def _never() -> bool:
    return False


def _deliver(responder: Any, request: pb_utils.InferenceRequest) -> Any:
    """A decoupled model's response goes out at once through the worker."""
    def deliver(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if response is None:
            responder.send(None, None, final)
            return
        r = _to_worker_response(response, request)
        responder.send(None if r.error else r.outputs, r.error, final, r.parameters)
    return deliver


def _to_worker_response(response: pb_utils.InferenceResponse,
                        request: pb_utils.InferenceRequest) -> WorkerResponse:
    """Error or outputs, pruned to the requested names as Triton prunes them."""
    error = response.error()
    if error is not None:
        return WorkerResponse(error=TritonError(Code[error.code().name], error.message()))
    wanted = set(request.requested_output_names())
    outputs = {t.name(): t._array for t in response.output_tensors()      # a BF16 tensor's bits too
               if not wanted or t.name() in wanted}
    return WorkerResponse(outputs, parameters=response._parameter_values)
