"""The example model repository: builds, ONNX models compute what they claim, configs parse,
and the Python models behave as documented under a minimal stand-in for Triton's pb_utils."""
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from onnx import numpy_helper
from tritonclient.grpc import model_config_pb2

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "examples" / "model_repository"
MODELS = {
    "mlp_onnx",
    "mlp_onnx_nobatch",
    "add_sub_onnx",
    "identity_fp32",
    "identity_dyn",
    "string_upper",
    "dtypes_py",
    "batch_reporter",
    "image_preprocess_model",
    "image_encoder_onnx",
    "search_pipeline_ensemble",
    "bls_router",
    "toy_llm",
    "tiny_llm",
    "accumulator",
}
TORCH_MODELS = {"mlp_torch"}  # built only where torch is importable
# Built where their framework is importable; left out here to keep the build fast (the
# OpenVINO and TensorFlow tests build and check them).
FRAMEWORK_MODELS = {"mlp_openvino", "mlp_tensorflow"}
COMMITTED = MODELS | TORCH_MODELS | FRAMEWORK_MODELS
BUILT = MODELS | TORCH_MODELS


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_repository = _load("build_repository", ROOT / "examples" / "build_repository.py")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("models")
    build_repository.build(str(dest), BUILT)
    return dest


def _session(repo: Path, model: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_repository_has_every_model(repo):
    expected = MODELS | (TORCH_MODELS if importlib.util.find_spec("torch") else set())
    assert {p.name for p in repo.iterdir()} == expected
    assert {p.name for p in SOURCE.iterdir() if p.is_dir()} == COMMITTED
    for name in MODELS:
        assert (repo / name / "config.pbtxt").is_file()
        assert (repo / name / "1").is_dir()


def test_no_binaries_are_committed():
    assert not list(SOURCE.rglob("*.onnx"))


@pytest.mark.parametrize("model", ["mlp_onnx", "mlp_onnx_nobatch"])
def test_mlp_matches_numpy(repo, model):
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    (out,) = _session(repo, model).run(None, {"INPUT0": x})
    assert out.shape == (3, 256) and out.dtype == np.float32
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(repo / model / "1" / "model.onnx").graph.initializer}
    h = x
    for i in range(3):
        h = h @ weights[f"W{i}"] + weights[f"B{i}"]
        if i < 2:
            h = np.maximum(h, 0)
    np.testing.assert_allclose(out, h, rtol=1e-4, atol=1e-4)


def test_mlp_copies_are_identical_and_deterministic(repo, tmp_path):
    build_repository.build(str(tmp_path), {"mlp_onnx"})
    first = (repo / "mlp_onnx" / "1" / "model.onnx").read_bytes()
    assert (repo / "mlp_onnx_nobatch" / "1" / "model.onnx").read_bytes() == first
    assert (tmp_path / "mlp_onnx" / "1" / "model.onnx").read_bytes() == first


def test_add_sub_values_and_dynamic_batch(repo):
    session = _session(repo, "add_sub_onnx")
    assert [(i.name, i.shape[1]) for i in session.get_inputs()] == [("INPUT0", 16), ("INPUT1", 16)]
    assert all(isinstance(i.shape[0], str) for i in session.get_inputs()), "batch dimension must be dynamic"
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, dtype=np.float32)
    added, subtracted = session.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(added, a + b)
    np.testing.assert_array_equal(subtracted, a - b)


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_config_parses_as_model_config(name):
    config = _config(SOURCE / name / "config.pbtxt")
    assert config.name == name
    assert config.platform in ("onnxruntime_onnx", "pytorch_libtorch", "tensorflow_savedmodel", "ensemble") \
        or config.backend in ("python", "openvino")


def test_config_details():
    mlp = _config(SOURCE / "mlp_onnx" / "config.pbtxt")
    assert mlp.max_batch_size == 64 and mlp.dynamic_batching.max_queue_delay_microseconds == 200
    assert list(mlp.input[0].dims) == [256] and mlp.input[0].data_type == model_config_pb2.TYPE_FP32
    assert mlp.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert not _config(SOURCE / "mlp_onnx_nobatch" / "config.pbtxt").HasField("dynamic_batching")
    add_sub = _config(SOURCE / "add_sub_onnx" / "config.pbtxt")
    assert add_sub.max_batch_size == 8 and not add_sub.input and not add_sub.output
    assert _config(SOURCE / "identity_dyn" / "config.pbtxt").HasField("dynamic_batching")
    reporter = _config(SOURCE / "batch_reporter" / "config.pbtxt")
    assert reporter.max_batch_size == 32
    assert reporter.dynamic_batching.max_queue_delay_microseconds == 200000
    assert [o.name for o in reporter.output] == ["OUTPUT0", "BATCH_SIZE", "BATCH_ELEMENTS"]


class FakeTensor:
    def __init__(self, name, array):
        self._name, self._array = name, array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class FakeResponse:
    def __init__(self, output_tensors, error=None):
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


class FakeRequest:
    def __init__(self, inputs, parameters=None):
        self.inputs = {k: FakeTensor(k, v) for k, v in inputs.items()}
        self._parameters = json.dumps(parameters or {})

    def parameters(self):
        return self._parameters


@pytest.fixture
def pb_utils(monkeypatch):
    """The few pb_utils names the example models use, enough to run execute() here."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor = FakeTensor
    fake.InferenceResponse = FakeResponse
    fake.TritonError = str
    fake.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    return fake


def _model(pb_utils, name):
    return _load(f"example_{name}", SOURCE / name / "1" / "model.py").TritonPythonModel()


@pytest.mark.parametrize("name", ["identity_fp32", "identity_dyn"])
def test_identity(pb_utils, name):
    x = np.arange(5, dtype=np.float32)
    (response,) = _model(pb_utils, name).execute([FakeRequest({"INPUT0": x})])
    np.testing.assert_array_equal(response.outputs["OUTPUT0"], x)


def test_string_upper(pb_utils):
    words = np.array([b"hello", "\u00e9t\u00e9".encode(), b""], dtype=np.object_)
    ok, bad = _model(pb_utils, "string_upper").execute(
        [FakeRequest({"INPUT0": words}), FakeRequest({"INPUT0": np.array([b"\xff"], dtype=np.object_)})]
    )
    assert list(ok.outputs["OUTPUT0"]) == [b"HELLO", "\u00c9T\u00c9".encode(), b""]
    assert ok.outputs["OUTPUT1"].dtype == np.int32 and list(ok.outputs["OUTPUT1"]) == [5, 3, 0]
    assert bad.error and not bad.outputs


def test_dtypes_echo(pb_utils):
    inputs = {
        "INPUT_FP32": np.array([1.5], np.float32),
        "INPUT_INT64": np.array([2**40], np.int64),
        "INPUT_BOOL": np.array([True, False]),
        "INPUT_FP16": np.array([0.25], np.float16),
        "INPUT_BYTES": np.array([b"x"], dtype=np.object_),
    }
    (response,) = _model(pb_utils, "dtypes_py").execute([FakeRequest(inputs)])
    for key, value in inputs.items():
        out = response.outputs[key.replace("INPUT", "OUTPUT")]
        assert out.dtype == value.dtype
        np.testing.assert_array_equal(out, value)


def test_batch_reporter(pb_utils):
    requests = [
        FakeRequest({"INPUT0": np.ones((2, 3), np.float32)}, {"sleep_ms": 1}),
        FakeRequest({"INPUT0": np.zeros((1, 3), np.float32)}),
    ]
    first, second = _model(pb_utils, "batch_reporter").execute(requests)
    np.testing.assert_array_equal(first.outputs["OUTPUT0"], np.ones((2, 3)))
    np.testing.assert_array_equal(first.outputs["BATCH_SIZE"], [[2], [2]])
    np.testing.assert_array_equal(second.outputs["BATCH_SIZE"], [[2]])
    np.testing.assert_array_equal(second.outputs["BATCH_ELEMENTS"], [[3]])
    assert first.outputs["BATCH_ELEMENTS"].dtype == np.int32


def test_the_examples_start_without_advice(repo):
    """A clean start of the example repository is clean: the models that are not batched are
    so on purpose and say so (batching_advice: off)."""
    from tritond.repository.catalog import check_repository
    specs = check_repository([str(repo)])
    assert {s.name for s in specs} == {p.name for p in repo.iterdir()}
    assert {s.name: s.advice for s in specs if s.error or s.advice} == {}


def test_tiny_llm_generation(pb_utils):
    """The same request always gets the same words; a seed, the temperature and stop change them
    as documented; an unknown setting is refused."""
    gen = _load("example_tiny_llm", SOURCE / "tiny_llm" / "1" / "model.py").generate
    words = gen("hello", {"max_tokens": 6, "seed": 3})
    assert len(words) == 6 and words == gen("hello", {"max_tokens": 6, "seed": 3})
    assert words[0][0] != " " and all(w.startswith(" ") for w in words[1:])
    assert gen("hello", {"max_tokens": 6, "seed": 4}) != words
    greedy = gen("hello", {"max_tokens": 8, "temperature": 0})
    assert greedy == gen("hello", {"max_tokens": 8, "temperature": 0, "seed": 9})
    text = "".join(greedy)
    stop = greedy[3]
    assert "".join(gen("hello", {"max_tokens": 8, "temperature": 0, "stop": [stop]})) == text[: text.index(stop)]
    assert len(gen("hello", {})) == 16
    with pytest.raises(ValueError, match="does not support"):
        gen("hello", {"best_of": 2})


def test_tiny_llm_refuses_long_answers_and_stops_when_cancelled(pb_utils):
    module = _load("example_tiny_llm", SOURCE / "tiny_llm" / "1" / "model.py")
    with pytest.raises(ValueError, match="above tiny_llm's limit of 4096"):
        module.generate("hello", {"max_tokens": 10**9})
    with pytest.raises(ValueError, match="limit of 5"):
        module.generate("hello", {"max_tokens": 6}, limit=5)
    asked = []
    with pytest.raises(module.Cancelled):
        module.generate("hello", {"max_tokens": 4000}, cancelled=lambda: asked.append(1) or len(asked) > 3)
    assert len(asked) == 4
    config = _config(SOURCE / "tiny_llm" / "config.pbtxt")
    assert config.parameters["max_tokens_limit"].string_value == "4096"
