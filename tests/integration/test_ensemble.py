"""The bundled image-search pipeline (`search_pipeline_ensemble` = `image_preprocess_model`
then `image_encoder_onnx`) and the BLS router, driven through tritonclient over HTTP and gRPC:
one ensemble call gives what two calls by hand give, its output can land in a client's
shared-memory region, and statistics count the ensemble and each model it composes."""
from __future__ import annotations

import io
import os
import secrets

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, serving

PROTOCOLS = ["http", "grpc"]
ENSEMBLE = "search_pipeline_ensemble"
PRE = "image_preprocess_model"
ENCODER = "image_encoder_onnx"


@pytest.fixture(scope="module")
def server(example_repo):
    with serving(TritondServer(example_repo, ["--allow-client-shm=true"], grpc=True)) as s:
        yield s


def connect(server, protocol):
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def raw_rgb(seed: int, side: int = 578) -> bytes:
    """Raw RGB pixels of a side x side image (578: about 1 MB)."""
    return np.random.default_rng(seed).integers(0, 256, 3 * side * side, dtype=np.uint8).tobytes()


def images_input(mod, images: list[bytes]):
    inp = mod.InferInput("RAW_IMAGE", [len(images), 1], "BYTES")
    inp.set_data_from_numpy(np.array(images, dtype=object).reshape(-1, 1))
    return inp


def fp32_input(mod, name: str, array: np.ndarray):
    inp = mod.InferInput(name, list(array.shape), "FP32")
    inp.set_data_from_numpy(array)
    return inp


def stats(client, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pipeline_equals_calling_both_models(server, protocol):
    mod, client = connect(server, protocol)
    images = [raw_rgb(1), raw_rgb(2, side=300)]
    embedding = client.infer(ENSEMBLE, [images_input(mod, images)]).as_numpy("EMBEDDING")
    image = client.infer(PRE, [images_input(mod, images)]).as_numpy("IMAGE")
    assert image.shape == (2, 3, 224, 224) and image.dtype == np.float32
    by_hand = client.infer(ENCODER, [fp32_input(mod, "IMAGE", image)]).as_numpy("EMBEDDING")
    assert embedding.shape == (2, 512) and embedding.dtype == np.float32
    np.testing.assert_allclose(embedding, by_hand, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, rtol=1e-5)


def test_png_decodes_like_the_same_raw_pixels(server):
    image_module = pytest.importorskip("PIL.Image")
    pixels = np.random.default_rng(3).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    buf = io.BytesIO()
    image_module.fromarray(pixels).save(buf, format="PNG")
    mod, client = connect(server, "http")
    from_png = client.infer(ENSEMBLE, [images_input(mod, [buf.getvalue()])]).as_numpy("EMBEDDING")
    from_raw = client.infer(ENSEMBLE, [images_input(mod, [pixels.tobytes()])]).as_numpy("EMBEDDING")
    np.testing.assert_array_equal(from_png, from_raw)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_failing_step_names_its_model(server, protocol):
    mod, client = connect(server, protocol)
    with pytest.raises(InferenceServerException) as e:
        client.infer(ENSEMBLE, [images_input(mod, [b"no image here"])])
    text = str(e.value)
    assert f"model '{PRE}'" in text and "RAW_IMAGE" in text and "neither PNG, JPEG nor raw RGB" in text
    good = client.infer(ENSEMBLE, [images_input(mod, [raw_rgb(4, side=50)])]).as_numpy("EMBEDDING")
    assert good.shape == (1, 512)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_output_written_into_a_client_region(server, protocol):
    mod, client = connect(server, protocol)
    images = [raw_rgb(5, side=224), raw_rgb(6, side=224)]
    expected = client.infer(ENSEMBLE, [images_input(mod, images)]).as_numpy("EMBEDDING")
    name, key, size = f"ens_out_{protocol}", f"/tritond_test_{secrets.token_hex(6)}", expected.nbytes
    handle = shm.create_shared_memory_region(name, key, size)
    try:
        client.register_system_shared_memory(name, key, size)
        out = mod.InferRequestedOutput("EMBEDDING", binary_data=True) if protocol == "http" \
            else mod.InferRequestedOutput("EMBEDDING")
        out.set_shared_memory(name, size)
        result = client.infer(ENSEMBLE, [images_input(mod, images)], outputs=[out])
        assert result.get_output("EMBEDDING") is not None
        got = shm.get_contents_as_numpy(handle, np.float32, [2, 512])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        client.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)
    assert not os.path.exists("/dev/shm" + key)


def test_statistics_count_the_ensemble_and_each_composing_model(server):
    mod, client = connect(server, "http")
    before = {m: stats(client, m) for m in (ENSEMBLE, PRE, ENCODER)}
    for seed in range(3):
        client.infer(ENSEMBLE, [images_input(mod, [raw_rgb(seed, side=64)])])
    after = {m: stats(client, m) for m in (ENSEMBLE, PRE, ENCODER)}

    def grew(model, *path):
        a, b = after[model], before[model]
        for key in path:
            a, b = a[key], b[key]
        return a - b

    assert grew(ENSEMBLE, "execution_count") == 3
    assert grew(ENSEMBLE, "inference_count") == 3
    batches = [{b["batch_size"]: b["compute_infer"]["count"] for b in s[ENSEMBLE]["batch_stats"]}
               for s in (after, before)]
    assert batches[0].get(1, 0) - batches[1].get(1, 0) == 3      # one execution of its size per request
    assert grew(ENSEMBLE, "inference_stats", "success", "count") == 3
    for model in (PRE, ENCODER):
        assert grew(model, "inference_stats", "success", "count") == 3
        assert 1 <= grew(model, "execution_count") <= 3


def test_repository_index_lists_the_ensemble_and_its_models(server):
    _, client = connect(server, "http")
    states = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
    assert states[ENSEMBLE] == states[PRE] == states[ENCODER] == "READY"
    config = client.get_model_config(ENSEMBLE)
    assert config["platform"] == "ensemble" and config["max_batch_size"] == 8
    assert client.is_model_ready(ENSEMBLE)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("route, sign, expected_route, factor", [
    ("identity", 1, b"identity", 1),
    ("add_sub", 1, b"add_sub", 2),
    (None, 1, b"add_sub", 2),
    (None, -1, b"identity", 1),
])
def test_bls_router_routes(server, protocol, route, sign, expected_route, factor):
    mod, client = connect(server, protocol)
    x = sign * np.arange(1, 17, dtype=np.float32)
    result = client.infer("bls_router", [fp32_input(mod, "INPUT0", x)],
                          parameters={"route": route} if route else None)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), factor * x)
    assert list(result.as_numpy("ROUTE")) == [expected_route]


def test_bls_router_rejects_an_unknown_route(server):
    mod, client = connect(server, "http")
    with pytest.raises(InferenceServerException, match="unknown route 'elsewhere'"):
        client.infer("bls_router", [fp32_input(mod, "INPUT0", np.zeros(16, np.float32))],
                     parameters={"route": "elsewhere"})
