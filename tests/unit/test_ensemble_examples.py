"""The image-search example pieces on their own: the encoder graph, and the preprocessing and
routing rules of the Python models, run under a minimal stand-in for pb_utils."""
import importlib.util
import io
import json
import sys
import types
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "examples" / "model_repository"


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class Response:
    def __init__(self, output_tensors=None, error=None):
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors or []}
        self.error = error


class Request:
    def __init__(self, parameters=None, **inputs):
        self.inputs = {k: Tensor(k, v) for k, v in inputs.items()}
        self._parameters = json.dumps(parameters or {})

    def parameters(self):
        return self._parameters


@pytest.fixture
def pb_utils(monkeypatch):
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor, fake.InferenceResponse, fake.TritonError = Tensor, Response, str
    fake.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    return fake


@pytest.fixture
def preprocess(pb_utils):
    return _load("example_preprocess", SOURCE / "image_preprocess_model" / "1" / "model.py")


def test_encoder_makes_unit_vectors_with_a_dynamic_batch(tmp_path):
    build = _load("build_repository", ROOT / "examples" / "build_repository.py")
    path = tmp_path / "encoder.onnx"
    path.write_bytes(build.image_encoder_model().SerializeToString())
    assert path.read_bytes() == build.image_encoder_model().SerializeToString()     # deterministic
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1:] == [3, 224, 224] and isinstance(session.get_inputs()[0].shape[0], str)
    (out,) = session.run(None, {"IMAGE": np.random.default_rng(0).standard_normal((3, 3, 224, 224), np.float32)})
    assert out.shape == (3, 512)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)


def test_raw_rgb_is_sampled_and_normalized(preprocess):
    side = 448
    pixels = np.random.default_rng(1).integers(0, 256, (side, side, 3), dtype=np.uint8)
    (response,) = preprocess.TritonPythonModel().execute(
        [Request(RAW_IMAGE=np.array([[pixels.tobytes()]], dtype=object))])
    image = response.outputs["IMAGE"]
    assert image.shape == (1, 3, 224, 224) and image.dtype == np.float32
    expected = (pixels[::2, ::2] / 255.0 - preprocess.MEAN) / preprocess.STD
    np.testing.assert_allclose(image[0], expected.transpose(2, 0, 1), rtol=1e-5, atol=1e-6)


def test_png_and_jpeg_are_decoded(preprocess):
    image_module = pytest.importorskip("PIL.Image")
    pixels = np.random.default_rng(2).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    decoded = {}
    for fmt in ("PNG", "JPEG"):
        buf = io.BytesIO()
        image_module.fromarray(pixels).save(buf, format=fmt)
        decoded[fmt] = preprocess.decode(buf.getvalue())
    np.testing.assert_array_equal(decoded["PNG"], pixels)
    assert decoded["JPEG"].shape == (224, 224, 3)


def test_a_malformed_image_fails_only_its_request(preprocess):
    good = np.zeros(3 * 10 * 10, np.uint8).tobytes()
    bad, ok = preprocess.TritonPythonModel().execute([
        Request(RAW_IMAGE=np.array([[b"12345"]], dtype=object)),
        Request(RAW_IMAGE=np.array([[good]], dtype=object)),
    ])
    assert "RAW_IMAGE: 5 bytes is neither PNG, JPEG nor raw RGB" in bad.error and not bad.outputs
    assert ok.outputs["IMAGE"].shape == (1, 3, 224, 224)


@pytest.mark.parametrize("parameters, total, route", [
    ({"route": "identity"}, 1.0, "identity"),
    ({"route": "add_sub"}, -1.0, "add_sub"),
    ({}, 0.0, "add_sub"),
    ({}, -0.5, "identity"),
])
def test_router_rule(pb_utils, parameters, total, route):
    router = _load("example_router", SOURCE / "bls_router" / "1" / "model.py")
    x = np.zeros(16, np.float32)
    x[0] = total
    assert router.route_of(Request(parameters), x) == route
    with pytest.raises(ValueError, match="unknown route 'nowhere'"):
        router.route_of(Request({"route": "nowhere"}), x)
