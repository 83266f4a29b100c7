"""PythonBackend drives real model.py files written into a temporary repository."""
import json
import re
import sys
import textwrap

import numpy as np
import pytest

from tritond.wire.errors import Code, TritonError
from tritond.repository.view import model_view
from tritond.workers import pb_utils
from tritond.workers.backends.base import InstanceInfo, WorkerRequest
from tritond.workers.backends.python import PythonBackend
from tritond.workers.model_errors import ModelError

IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", tensor.as_numpy()),
                 pb_utils.Tensor("EXTRA", tensor.as_numpy())]))
        return responses
"""

CONFIG = {
    "name": "m",
    "max_batch_size": 0,
    "backend": "python",
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1], "optional": False}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}],
}


def make_backend(tmp_path, source, config=None, filename="model.py"):
    model_dir = tmp_path / "m"
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    (version_dir / filename).write_text(textwrap.dedent(source))
    info = InstanceInfo(model_name="m", model_version=1, model_dir=str(model_dir),
                        version_dir=str(version_dir), instance_name="m_0_0",
                        model_repository=str(tmp_path))
    config = dict(config or CONFIG)
    return PythonBackend(config, model_view(config), info)


@pytest.fixture
def loaded(tmp_path):
    backends = []

    def factory(source, config=None):
        backend = make_backend(tmp_path, source, config)
        backend.load()
        backends.append(backend)
        return backend

    yield factory
    for backend in backends:
        backend.close()


def fp32_request(values, **kwargs):
    return WorkerRequest(inputs={"IN": np.asarray(values, dtype=np.float32)},
                         requested_outputs=kwargs.pop("requested_outputs", []), **kwargs)


def test_pb_utils_is_installed_under_triton_name(loaded):
    loaded(IDENTITY)
    assert sys.modules["triton_python_backend_utils"] is pb_utils


def test_initialize_args(loaded, tmp_path):
    backend = loaded("""
        import json
        class TritonPythonModel:
            def initialize(self, args):
                with open(args["model_repository"] + "/args.json", "w") as f:
                    json.dump(args, f)
            def execute(self, requests):
                return []
    """)
    args = json.loads((tmp_path / "m" / "args.json").read_text())
    assert all(isinstance(v, str) for v in args.values())
    assert json.loads(args.pop("model_config")) == backend.config
    assert args == {
        "model_instance_kind": "CPU", "model_instance_name": "m_0_0",
        "model_instance_device_id": "0", "model_repository": str(tmp_path / "m"),
        "model_version": "1", "model_name": "m",
    }


def test_initialize_failure_propagates(tmp_path):
    backend = make_backend(tmp_path, """
        class TritonPythonModel:
            def initialize(self, args):
                raise ValueError("bad weights")
    """)
    with pytest.raises(ModelError, match=r"^ValueError: bad weights\n\nAt:\n  .*model.py\(4\): initialize\n$") as info:
        backend.load()
    assert isinstance(info.value.__cause__, ValueError)


def test_missing_model_file(tmp_path):
    backend = make_backend(tmp_path, IDENTITY, filename="other.py")
    with pytest.raises(FileNotFoundError, match="Python model file not found"):
        backend.load()


def test_default_model_filename_and_sibling_imports(tmp_path):
    backend = make_backend(tmp_path, """
        from helper import SCALE
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", r.inputs()[0].as_numpy() * SCALE)]) for r in requests]
    """, config={**CONFIG, "default_model_filename": "custom.py"}, filename="custom.py")
    (tmp_path / "m" / "1" / "helper.py").write_text("SCALE = 3\n")
    backend.load()
    try:
        [resp] = backend.execute([fp32_request([1.0])])
        assert resp.outputs["OUT"].tolist() == [3.0]
    finally:
        backend.close()


def test_identity_fp32_prunes_to_configured_outputs(loaded):
    backend = loaded(IDENTITY)
    [resp] = backend.execute([fp32_request([1.5, 2.5])])
    assert resp.error is None
    assert list(resp.outputs) == ["OUT"]
    np.testing.assert_array_equal(resp.outputs["OUT"], np.array([1.5, 2.5], dtype=np.float32))


def test_requested_outputs_filter(loaded):
    backend = loaded(IDENTITY)
    [resp] = backend.execute([fp32_request([1.0], requested_outputs=["EXTRA"])])
    assert list(resp.outputs) == ["EXTRA"]


def test_identity_bytes(loaded):
    backend = loaded("""
        import numpy as np
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    data = r.inputs()[0].as_numpy()
                    assert data.dtype == np.object_ and r.inputs()[0].triton_dtype() == 13
                    text = np.array([x.decode().upper() for x in data.reshape(-1)])
                    out.append(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUT", data), pb_utils.Tensor("UPPER", text)]))
                return out
    """, config={**CONFIG, "output": [{"name": "OUT"}, {"name": "UPPER"}]})
    data = np.array([b"ab", b"\x00c"], dtype=object)
    [resp] = backend.execute([WorkerRequest(inputs={"IN": data}, requested_outputs=[])])
    assert resp.outputs["OUT"].dtype == np.object_
    assert resp.outputs["OUT"].tolist() == [b"ab", b"\x00c"]
    assert resp.outputs["UPPER"].dtype == np.object_
    assert resp.outputs["UPPER"].tolist() == [b"AB", b"\x00C"]


def test_batch_of_three_with_request_metadata(loaded):
    backend = loaded("""
        import json
        import numpy as np
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    meta = [r.request_id(), str(r.correlation_id()), str(r.flags()), str(r.timeout()),
                            json.loads(r.parameters()).get("tag", ""), ",".join(r.requested_output_names())]
                    out.append(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUT", r.inputs()[0].as_numpy() + 1),
                        pb_utils.Tensor("META", np.array(meta, dtype=object))]))
                return out
    """, config={**CONFIG, "output": [{"name": "OUT"}, {"name": "META"}]})
    requests = [fp32_request([i], request_id=f"r{i}", correlation_id=i, flags=1 if i == 0 else 0,
                             timeout_us=10 * i, parameters={"tag": f"t{i}", "ratio": 0.5}) for i in range(3)]
    responses = backend.execute(requests)     # a client's double parameter reaches the model
    assert [r.outputs["OUT"].tolist() for r in responses] == [[1.0], [2.0], [3.0]]
    assert responses[0].outputs["META"].tolist() == [b"r0", b"0", b"1", b"0", b"t0", b"OUT,META"]
    assert responses[2].outputs["META"].tolist() == [b"r2", b"2", b"0", b"20", b"t2", b"OUT,META"]


def test_one_request_returns_triton_error(loaded):
    backend = loaded("""
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    data = r.inputs()[0].as_numpy()
                    if data[0] < 0:
                        out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                            "negative input", pb_utils.TritonError.INVALID_ARG)))
                    else:
                        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
                return out
    """)
    good, bad = backend.execute([fp32_request([1.0]), fp32_request([-1.0])])
    assert good.error is None and good.outputs["OUT"].tolist() == [1.0]
    assert bad.error == TritonError(Code.INVALID_ARG, "negative input")
    assert bad.outputs == {}


def test_an_execute_exception_fails_every_request_in_tritons_words(loaded):
    backend = loaded("""
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                raise pb_utils.TritonModelException("execute exploded")
    """)
    responses = backend.execute([fp32_request([1.0]), fp32_request([2.0])])
    assert len(responses) == 2
    for r in responses:
        assert r.error.code is Code.INTERNAL
        assert re.fullmatch(r"Failed to process the request\(s\) for model 'm_0_0', message: TritonModelException: "
                            r"execute exploded\n\nAt:\n  .*model.py\(5\): execute\n", r.error.message), r.error


def test_async_execute(loaded):
    backend = loaded("""
        import asyncio
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            async def execute(self, requests):
                await asyncio.sleep(0)
                return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy() * 2)])
                        for r in requests]
    """)
    for _ in range(2):
        responses = backend.execute([fp32_request([1.0]), fp32_request([4.0])])
        assert [r.outputs["OUT"].tolist() for r in responses] == [[2.0], [8.0]]


def test_async_execute_exception_propagates(loaded):
    backend = loaded("""
        class TritonPythonModel:
            async def execute(self, requests):
                raise RuntimeError("async failure")
    """)
    [response] = backend.execute([fp32_request([1.0])])
    assert "message: RuntimeError: async failure\n\nAt:\n" in response.error.message


@pytest.mark.parametrize("body, message", [
    ("return [pb_utils.InferenceResponse()]",
     "InferenceRequest(s) size is:2, and InferenceResponse(s) size is:1"),
    ("return tuple(pb_utils.InferenceResponse() for _ in requests)",
     "Expected a list in the execute return, found type '<class 'tuple'>'."),
    ("return [None for _ in requests]",
     "Expected an 'InferenceResponse' object in the execute function return list, found type"),
])
def test_bad_execute_return_fails_every_request(loaded, body, message):
    backend = loaded(f"""
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                {body}
    """)
    responses = backend.execute([fp32_request([1.0]), fp32_request([2.0])])
    assert len(responses) == 2
    for resp in responses:
        code, text = resp.error.code, resp.error.message
        assert code is Code.INTERNAL
        assert text.startswith("Failed to process the request(s) for model 'm_0_0', message: ")
        assert message in text


def test_finalize_called_on_close(tmp_path):
    backend = make_backend(tmp_path, """
        class TritonPythonModel:
            def initialize(self, args):
                self.path = args["model_repository"] + "/finalized"
            def execute(self, requests):
                return []
            def finalize(self):
                open(self.path, "w").close()
    """)
    backend.load()
    backend.close()
    assert (tmp_path / "m" / "finalized").exists()


AUTO_COMPLETE = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""


def test_auto_complete_fills_config(tmp_path):
    backend = make_backend(tmp_path, AUTO_COMPLETE,
                           config={"name": "m", "max_batch_size": 0, "input": [], "output": []})
    completed = backend.auto_complete()
    assert completed["max_batch_size"] == 8
    assert completed["dynamic_batching"] == {}
    assert completed["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}]
    assert completed["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]
    assert backend.config["input"] == []


def test_auto_complete_conflict(tmp_path):
    config = {"name": "m", "max_batch_size": 0, "output": [],
              "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [4]}]}
    backend = make_backend(tmp_path, AUTO_COMPLETE, config=config)
    with pytest.raises(ModelError, match="^ValueError: unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'IN'"):
        backend.auto_complete()


def test_auto_complete_absent_or_bad_return(tmp_path):
    assert make_backend(tmp_path / "a", IDENTITY).auto_complete() is None
    backend = make_backend(tmp_path / "b", """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                return None
    """)
    with pytest.raises(TypeError, match="must return a valid pb.ModelConfig object"):
        backend.auto_complete()


def test_bls_from_execute(loaded):
    seen = []

    def handler(model_name, model_version, inputs, requested, request_id, parameters, *rest):
        seen.append((model_name, request_id))
        if model_name == "missing":
            return {}, TritonError(Code.NOT_FOUND, "Request for unknown model: 'missing' is not found"), {}
        array, datatype = inputs["IN"]
        return {"OUT": (array * 10, datatype)}, None, {}

    pb_utils.set_bls_handler(handler)
    try:
        backend = loaded("""
            import triton_python_backend_utils as pb_utils
            class TritonPythonModel:
                async def execute(self, requests):
                    out = []
                    for r in requests:
                        bls = pb_utils.InferenceRequest(
                            model_name="sub", inputs=r.inputs(), requested_output_names=["OUT"],
                            request_id=r.request_id())
                        sync_resp = bls.exec()
                        async_resp = await bls.async_exec()
                        missing = pb_utils.InferenceRequest(
                            model_name="missing", inputs=[], requested_output_names=[]).exec()
                        if not missing.has_error():
                            raise pb_utils.TritonModelException("expected an error")
                        total = (pb_utils.get_output_tensor_by_name(sync_resp, "OUT").as_numpy()
                                 + pb_utils.get_output_tensor_by_name(async_resp, "OUT").as_numpy())
                        out.append(pb_utils.InferenceResponse(
                            [pb_utils.Tensor("OUT", total)],
                            error=None if total[0] else pb_utils.TritonError(missing.error().message())))
                    return out
        """)
        ok, err = backend.execute([fp32_request([1.0], request_id="a"), fp32_request([0.0], request_id="b")])
    finally:
        pb_utils.set_bls_handler(None)
    assert ok.outputs["OUT"].tolist() == [20.0]
    assert err.error == TritonError(Code.INTERNAL, "Request for unknown model: 'missing' is not found")
    assert seen[:3] == [("sub", "a"), ("sub", "a"), ("missing", "")]
