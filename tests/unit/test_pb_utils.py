"""pb_utils: tensors, errors, dtype helpers, ModelConfig rules and BLS through the worker hook."""
import asyncio
import json

import numpy as np
import pytest

from tritond.wire.errors import Code, TritonError
from tritond.workers import pb_utils


@pytest.fixture(autouse=True)
def no_bls_handler():
    yield
    pb_utils.set_bls_handler(None)


def test_tensor_fp32_and_codes():
    t = pb_utils.Tensor("X", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.name() == "X"
    assert t.shape() == [2, 3]
    assert t.triton_dtype() == 11
    assert t.is_cpu()
    assert t.as_numpy().dtype == np.float32


def test_tensor_strings_become_object_bytes():
    t = pb_utils.Tensor("S", np.array([["a", "bc"]]))
    arr = t.as_numpy()
    assert arr.dtype == np.object_ and arr.shape == (1, 2)
    assert arr.tolist() == [[b"a", b"bc"]]
    assert t.triton_dtype() == 13
    assert pb_utils.Tensor("B", np.array([b"x"])).as_numpy().tolist() == [b"x"]


def test_tensor_keeps_scalars_and_makes_views_contiguous():
    assert pb_utils.Tensor("s", np.float32(2)).shape() == []
    view = np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2]
    t = pb_utils.Tensor("v", view)
    assert t.as_numpy().flags.c_contiguous and t.shape() == [3, 2]
    obj = pb_utils.Tensor("o", np.array(["x", b"y"], dtype=object))
    assert obj.as_numpy().tolist() == [b"x", b"y"]


def test_tensor_rejects_empty_name_and_bad_dtype():
    with pytest.raises(pb_utils.TritonModelException, match="empty string"):
        pb_utils.Tensor("", np.zeros(1))
    with pytest.raises(pb_utils.TritonModelException, match="not supported"):
        pb_utils.Tensor("c", np.zeros(1, dtype=np.complex64))


def test_dlpack_round_trip_including_read_only():
    src = np.frombuffer(np.arange(4, dtype=np.int32).tobytes(), dtype=np.int32)
    assert not src.flags.writeable
    t = pb_utils.Tensor("A", src)
    back = pb_utils.Tensor.from_dlpack("B", t.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), src)
    via_protocol = pb_utils.Tensor.from_dlpack("C", np.ones(3, dtype=np.float64))
    assert via_protocol.triton_dtype() == 12
    with pytest.raises(pb_utils.TritonModelException, match="string"):
        pb_utils.Tensor("S", np.array([b"x"], dtype=object)).to_dlpack()


def test_triton_error_codes():
    err = pb_utils.TritonError("boom")
    assert err.code() == pb_utils.TritonError.INTERNAL == 1
    assert err.code().name == "INTERNAL"
    err = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert (err.message(), err.code().name) == ("nope", "NOT_FOUND")
    assert pb_utils.TritonError("x", 3).code().name == "INVALID_ARG"
    assert [c.name for c in pb_utils.ErrorCode] == [
        "UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE",
        "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED"]


def test_dtype_helpers():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.int64) == 9
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.triton_to_numpy_type(1) is np.bool_
    assert pb_utils.triton_to_numpy_type(14) is None
    encoded = pb_utils.serialize_byte_tensor(np.array([b"ab", "c"], dtype=object))
    assert encoded == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == [b"ab", b"c"]
    assert pb_utils.serialize_byte_tensor(np.zeros(2)) is None


def test_constants():
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert (pb_utils.TRITONSERVER_MEMORY_GPU, pb_utils.TRITONSERVER_MEMORY_CPU) == (0, 1)


def test_lookup_helpers():
    req = pb_utils.InferenceRequest(
        model_name="m", inputs=[pb_utils.Tensor("A", np.zeros(1))], requested_output_names=[])
    assert pb_utils.get_input_tensor_by_name(req, "A").name() == "A"
    assert pb_utils.get_input_tensor_by_name(req, "Z") is None
    resp = pb_utils.InferenceResponse([pb_utils.Tensor("O", np.zeros(1))])
    assert pb_utils.get_output_tensor_by_name(resp, "O") is not None
    assert pb_utils.get_output_tensor_by_name(resp, "P") is None
    config = {"input": [{"name": "A", "dims": [1]}], "output": [{"name": "O", "dims": [2]}]}
    assert pb_utils.get_input_config_by_name(config, "A")["dims"] == [1]
    assert pb_utils.get_output_config_by_name(config, "O")["dims"] == [2]
    assert pb_utils.get_input_config_by_name(config, "O") is None
    assert not pb_utils.using_decoupled_model_transaction_policy(config)
    config["model_transaction_policy"] = {"decoupled": True}
    assert pb_utils.using_decoupled_model_transaction_policy(config)


def test_request_and_response_accessors():
    req = pb_utils.InferenceRequest(
        request_id="r1", correlation_id="seq", model_name="m", inputs=[],
        requested_output_names=["O"], flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        timeout=5, parameters={"k": 1, "b": True})
    assert (req.request_id(), req.correlation_id(), req.flags(), req.timeout()) == ("r1", "seq", 1, 5)
    assert json.loads(req.parameters()) == {"k": 1, "b": True}
    assert req.requested_output_names() == ["O"]
    assert req.model_name == "m"
    assert req.is_cancelled() is False
    assert req.trace().get_context() is None
    req.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
    with pytest.raises(pb_utils.TritonModelException, match="response sender"):
        req.get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID"):
        pb_utils.InferenceRequest(correlation_id=1.5, model_name="m", inputs=[], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str"):
        pb_utils.InferenceResponse(parameters={"k": [1]})
    resp = pb_utils.InferenceResponse(parameters={"p": "v"})
    assert not resp.has_error() and resp.error() is None
    assert json.loads(resp.parameters()) == {"p": "v"}


def test_arguments_are_checked_as_tritons_binding_checks_them():
    """pybind11 raises TypeError for a wrong type or None; Triton's own checks raise TritonModelException."""
    x = [pb_utils.Tensor("X", np.ones(2, np.int32))]
    args = {"inputs": x, "model_name": "m", "requested_output_names": ["O"]}
    for bad in ({"inputs": None}, {"model_name": None}, {"requested_output_names": None},
                {"requested_output_names": [None]}, {"correlation_id": None}, {"request_id": None},
                {"model_version": None}, {"flags": None}):
        with pytest.raises(TypeError):
            pb_utils.InferenceRequest(**{**args, **bad})
    with pytest.raises(pb_utils.TritonModelException, match="Input tensor for request with id '' and model name 'm'"):
        pb_utils.InferenceRequest(**{**args, "inputs": [None]})
    with pytest.raises(pb_utils.TritonModelException, match="Requested output name .* should not be empty"):
        pb_utils.InferenceRequest(**{**args, "requested_output_names": [""]})
    pb_utils.InferenceRequest(inputs=[], requested_output_names=[], model_name="m")
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)
    with pytest.raises(pb_utils.TritonModelException, match="should not be empty"):
        pb_utils.InferenceResponse(output_tensors=[None])
    with pytest.raises(pb_utils.TritonModelException, match="found type <class 'float'>"):
        pb_utils.InferenceResponse(x, parameters={"f": 0.5})
    for name, array in ((None, np.ones(2)), ("O", None), ("", None)):
        with pytest.raises(TypeError):
            pb_utils.Tensor(name, array)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor.from_dlpack("O", None)
    for call in (lambda: pb_utils.Logger.log("m", None), lambda: pb_utils.Logger.log("m", 1),
                 lambda: pb_utils.Logger.log_info(None), lambda: pb_utils.Logger.log_warn(None),
                 lambda: pb_utils.Logger.log_error(None)):
        with pytest.raises(TypeError):
            call()


def test_logger_routes_to_python_logging(caplog):
    with caplog.at_level("DEBUG", logger="tritond.model"):
        pb_utils.Logger.log_info("hello")
        pb_utils.Logger.log_verbose("detail")
        pb_utils.Logger.log("bad", pb_utils.Logger.ERROR)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "hello"), ("DEBUG", "detail"), ("ERROR", "bad")]


# ---------------------------------------------------------------- ModelConfig

def _config(**extra):
    base = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    base.update(extra)
    return pb_utils.ModelConfig(json.dumps(base))


def test_model_config_additions():
    cfg = _config()
    cfg.set_max_batch_size(8)
    cfg.set_dynamic_batching()
    cfg.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    cfg.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    cfg.set_model_transaction_policy({"decoupled": False})
    d = cfg.as_dict()
    assert cfg.max_batch_size() == 8
    assert d["dynamic_batching"] == {}
    assert d["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True}]
    assert d["output"][0]["name"] == "OUT"
    assert d["model_transaction_policy"] == {"decoupled": False}


def test_model_config_fills_existing_entry():
    cfg = _config(input=[{"name": "IN", "data_type": "TYPE_INVALID", "dims": [], "optional": False}])
    cfg.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})
    assert cfg.as_dict()["input"] == [{"name": "IN", "data_type": "TYPE_INT32", "dims": [2], "optional": False}]


@pytest.mark.parametrize("action, message", [
    (lambda c: c.set_max_batch_size(2), "configuration specified max_batch_size 4"),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [4]}),
     "configuration expects datatype TYPE_FP32 for input 'IN', model provides TYPE_INT32"),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [5]}),
     "the model expects dims [5] but the model configuration specifies dims [4]"),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True}),
     "the model expects optional True"),
    (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": "x"}),
     "contains property other than 'name', 'data_type', 'dims' and 'optional'"),
    (lambda c: c.add_output({"name": "O", "dims": [1]}), "is missing 'data_type' property"),
    (lambda c: c.add_output({"data_type": "TYPE_FP32", "dims": [1]}), "is missing 'name' property"),
    (lambda c: c.set_dynamic_batching(), "scheduling_choice as 'sequence_batching'"),
    (lambda c: c.set_model_transaction_policy({"decoupled": False}), "already set to 'True'"),
    (lambda c: c.set_model_transaction_policy({"other": 1}), "contains property other than 'decoupled'"),
])
def test_model_config_conflicts(action, message):
    cfg = _config(max_batch_size=4, sequence_batching={},
                  input=[{"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": False}],
                  model_transaction_policy={"decoupled": True})
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        action(cfg)


# ---------------------------------------------------------------- BLS

def _bls_request(**kwargs):
    return pb_utils.InferenceRequest(
        model_name="target", inputs=[pb_utils.Tensor("IN", np.array([1, 2], dtype=np.int32))],
        requested_output_names=["OUT"], **kwargs)


def test_bls_without_handler_is_an_error_response():
    resp = _bls_request().exec()
    assert resp.has_error() and resp.error().message() == "BLS is not available"


def test_bls_exec_calls_handler():
    calls = []

    def handler(*args):
        calls.append(args)
        array, datatype = args[2]["IN"]
        return {"OUT": (array * 2, datatype)}, None, {}

    cancelled = []

    def stream_handler(*args):
        return iter([({"OUT": args[2]["IN"]}, None, {"n": 1}), ({}, None, {})]), lambda: cancelled.append(True)

    pb_utils.set_bls_handler(handler, stream_handler)
    resp = _bls_request(request_id="b1", model_version=3, correlation_id=7, flags=2,
                        timeout=100, parameters={"p": "v"}).exec()
    assert not resp.has_error()
    np.testing.assert_array_equal(pb_utils.get_output_tensor_by_name(resp, "OUT").as_numpy(), [2, 4])
    model, version, inputs, outputs, rid, params, corr, flags, timeout, trace = calls[0]
    assert (model, version, list(inputs), outputs, rid) == ("target", 3, ["IN"], ["OUT"], "b1")
    assert (params, corr, flags, timeout, trace) == ({"p": "v"}, 7, 2, 100, 0)
    responses = _bls_request().exec(decoupled=True)
    assert [([t.name() for t in r.output_tensors()], json.loads(r.parameters())) for r in responses] == [
        (["OUT"], {"n": 1}), ([], {})]
    responses.cancel()
    assert cancelled == [True]


def test_a_decoupled_bls_call_returns_once_its_first_response_arrived():
    """As Triton's: `await request.async_exec(decoupled=True)` waits for the first response in the
    executor, so an async model's concurrent calls wait side by side, never on the event loop."""
    fetched = []

    def responses(args):
        for i in range(3):
            fetched.append(i)
            yield {"OUT": (args[2]["IN"][0] + i, "INT32")}, None, {}

    pb_utils.set_bls_handler(None, lambda *args: (responses(args), None))
    got = _bls_request().exec(decoupled=True)
    assert fetched == [0]                       # the first one came in exec(), the rest as iterated
    assert [int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0]) for r in got] == [1, 2, 3]
    assert fetched == [0, 1, 2]
    pb_utils.set_bls_handler(None, lambda *args: (iter(()), None))
    assert list(_bls_request().exec(decoupled=True)) == []


def test_a_bls_model_name_read_from_a_bytes_tensor_is_taken():
    # L0_trace's bls_simple passes MODEL_NAME's as_numpy()[0], a bytes object
    calls = []
    pb_utils.set_bls_handler(lambda *args: calls.append(args) or ({}, None, {}))
    pb_utils.InferenceRequest(model_name=b"target", inputs=[], requested_output_names=[]).exec()
    assert calls[0][0] == "target"


def test_a_bls_request_made_with_a_requests_trace_names_it():
    calls = []
    pb_utils.set_bls_handler(lambda *args: calls.append(args) or ({}, None, {}))
    received = pb_utils.InferenceRequest(inputs=[], requested_output_names=[], model_name="bls",
                                         trace=pb_utils.InferenceTrace(42))
    assert received.trace().get_context() is None       # mode triton
    assert pb_utils.InferenceTrace(42, '{"traceparent":"00-1-2-01"}').get_context() == '{"traceparent":"00-1-2-01"}'
    _bls_request(trace=received.trace()).exec()
    assert calls[0][-1] == 42


def test_bls_error_propagation():
    pb_utils.set_bls_handler(lambda *a: ({}, TritonError(Code.NOT_FOUND, "no model 'target'"), {}))
    resp = _bls_request().exec()
    assert resp.has_error()
    assert resp.error().message() == "no model 'target'"
    assert resp.error().code() == pb_utils.TritonError.NOT_FOUND

    def broken(*a):
        raise RuntimeError("worker gone")

    pb_utils.set_bls_handler(broken)
    resp = _bls_request().exec()
    assert resp.error().message() == "worker gone" and resp.error().code().name == "INTERNAL"


def test_bls_async_exec():
    pb_utils.set_bls_handler(lambda m, v, inputs, *rest: ({"OUT": (inputs["IN"][0] + 1, "INT32")}, None, {"p": 1}))

    async def run():
        return await asyncio.gather(_bls_request().async_exec(), _bls_request().async_exec())

    responses = asyncio.run(run())
    for resp in responses:
        np.testing.assert_array_equal(resp.output_tensors()[0].as_numpy(), [2, 3])
        assert json.loads(resp.parameters()) == {"p": 1}



def test_model_control_goes_to_the_worker_and_its_errors_are_the_models():
    calls = []

    class Control:
        def load_model(self, *args):
            calls.append(("load", *args))
            if args[0] == "missing":
                raise TritonError(Code.INVALID_ARG, "failed to load 'missing'")

        def unload_model(self, *args):
            calls.append(("unload", *args))

        def is_model_ready(self, *args):
            calls.append(("ready", *args))
            return True

    with pytest.raises(pb_utils.TritonModelException, match="not available"):
        pb_utils.load_model("m")
    pb_utils.set_model_control(Control())
    try:
        pb_utils.load_model("m", '{"backend": "python"}', {"file:1/model.py": b"x"})
        pb_utils.unload_model("m", unload_dependents=True)
        assert pb_utils.is_model_ready("m") and pb_utils.is_model_ready("m", "2")
        with pytest.raises(pb_utils.TritonModelException, match="failed to load 'missing'"):
            pb_utils.load_model("missing")
    finally:
        pb_utils.set_model_control(None)
    assert calls[:4] == [("load", "m", '{"backend": "python"}', {"file:1/model.py": b"x"}), ("unload", "m", True),
                         ("ready", "m", -1), ("ready", "m", 2)]
