"""OpenVINO and TensorFlow SavedModel models served by tritond, checked against the frameworks
called directly, over HTTP and gRPC: the example MLP agrees on all four backends, dynamic
batching forms batches, Triton's parameters and signatures apply, config errors are located,
a killed worker fails its batch and is replaced, and neither framework is loaded by the broker
or the frontends."""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, build_example_repository, http_get, metric, serving, wait_for

ov = pytest.importorskip("openvino", reason="openvino is not installed (pip install 'tritond[openvino]')")
tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed (pip install 'tritond[tensorflow]')")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WIDTH = 256
MLPS = ("mlp_onnx", "mlp_torch", "mlp_openvino", "mlp_tensorflow")
IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
"""


def model_dir(repo: Path, name: str, config: str | None, files: dict[str, Path]) -> None:
    """A model `name` with `config` (None: no config.pbtxt) and version-1 files copied from `files`."""
    (repo / name / "1").mkdir(parents=True)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    for target, source in files.items():
        copy = shutil.copytree if source.is_dir() else shutil.copy
        copy(source, repo / name / "1" / target)


class Scaler(tf.Module):
    """Two signatures over a float and a string input: `serving_default` doubles, `triple` triples
    (the `tf_triple` model serves `triple`; its config lists no inputs or outputs)."""

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x"),
                                  tf.TensorSpec([None], tf.string, name="text")])
    def double(self, x, text):
        return {"y": x * 2.0, "length": tf.strings.length(text), "upper": tf.strings.upper(text)}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x"),
                                  tf.TensorSpec([None], tf.string, name="text")])
    def triple(self, x, text):
        return {"y": x * 3.0, "length": tf.strings.length(text), "upper": tf.strings.upper(text)}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = build_example_repository(tmp_path_factory.mktemp("frameworks") / "models",
                                    tuple(m for m in MLPS))
    for name in ("mlp_openvino", "mlp_tensorflow"):
        if not (repo / name).is_dir():
            pytest.skip(f"the example repository has no {name}")
    ir = {"model.xml": repo / "mlp_openvino" / "1" / "model.xml", "model.bin": repo / "mlp_openvino" / "1" / "model.bin"}
    saved = {"model.savedmodel": repo / "mlp_tensorflow" / "1" / "model.savedmodel"}
    onnx = {"model.onnx": repo / "mlp_onnx" / "1" / "model.onnx"}
    batched = "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }"
    model_dir(repo, "ov_batched", f'backend: "openvino"\n{batched}\n{IO}', ir)
    model_dir(repo, "tf_batched", f'platform: "tensorflow_savedmodel"\n{batched}\n{IO}', saved)
    model_dir(repo, "ov_auto", None, ir)                     # auto-complete from the IR and its layout
    model_dir(repo, "ov_onnx", 'backend: "openvino"\ndefault_model_filename: "model.onnx"', onnx)
    static = 'backend: "openvino"\nmax_batch_size: 4\n' + IO + \
        'parameters { key: "SKIP_OV_DYNAMIC_BATCHSIZE" value: { string_value: "YES" } }\n'
    model_dir(repo, "ov_static", static, ir)
    model_dir(repo, "ov_static_padded", static +
              'parameters { key: "ENABLE_BATCH_PADDING" value: { string_value: "yes" } }\n', ir)
    model_dir(repo, "ov_reshaped", 'backend: "openvino"\nmax_batch_size: 4\n' + IO +
              'parameters { key: "RESHAPE_IO_LAYERS" value: { string_value: "YES" } }\n', ir)
    scaler = Scaler()
    signatures = {"serving_default": scaler.double.get_concrete_function(),
                  "triple": scaler.triple.get_concrete_function()}
    tf.saved_model.save(scaler, str(repo.parent / "scaler"), signatures=signatures)
    model_dir(repo, "tf_triple", 'platform: "tensorflow_savedmodel"\n'
              'parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "triple" } }\n'
              'parameters { key: "TF_NUM_INTRA_THREADS" value: { string_value: "1" } }',
              {"model.savedmodel": repo.parent / "scaler"})
    for name, config, _field, _text in BROKEN:
        model_dir(repo, name, config, ir if "openvino" in config else saved)
    (repo / "ov_no_weights" / "1" / "model.bin").unlink()
    return repo


# (model, config, expected field, expected text): each is UNAVAILABLE with a located reason.
BROKEN = [
    ("ov_bad_streams", 'backend: "openvino"\nmax_batch_size: 4\n' + IO +
     'parameters { key: "NUM_STREAMS" value: { string_value: "many" } }', "parameters.NUM_STREAMS",
     "AUTO/NUMA/<int_value>"),
    ("ov_bad_switch", 'backend: "openvino"\nmax_batch_size: 4\n' + IO +
     'parameters { key: "ENABLE_BATCH_PADDING" value: { string_value: "true" } }', "parameters.ENABLE_BATCH_PADDING",
     "YES or NO"),
    ("ov_bad_name", 'backend: "openvino"\nmax_batch_size: 4\n' + IO.replace('"INPUT0"', '"IN"'), "input[0].name",
     "unexpected inference input 'IN'"),
    ("ov_bad_dims", 'backend: "openvino"\nmax_batch_size: 4\n' + IO.replace("[ 256 ] } ]\noutput", "[ 128 ] } ]\noutput"),
     "input[0].dims", "the model expects 2 dimensions"),
    ("ov_bad_type", 'backend: "openvino"\nmax_batch_size: 4\n' + IO.replace("TYPE_FP32", "TYPE_STRING", 1),
     "input[0].data_type", "unsupported datatype TYPE_STRING"),
    ("ov_no_weights", 'backend: "openvino"\nmax_batch_size: 4\n' + IO, "default_model_filename", "model.bin"),
    ("tf_bad_signature", 'platform: "tensorflow_savedmodel"\nmax_batch_size: 4\n' + IO +
     'parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "predict" } }', "parameters.TF_SIGNATURE_DEF",
     "no 'predict' signature"),
    ("tf_bad_type", 'platform: "tensorflow_savedmodel"\nmax_batch_size: 4\n' + IO.replace("TYPE_FP32", "TYPE_FP16", 1),
     "input[0].data_type", "model provides TYPE_FP32"),
    ("tf_bad_dims", 'platform: "tensorflow_savedmodel"\nmax_batch_size: 4\n' +
     IO.replace("[ 256 ] } ]\noutput", "[ 128 ] } ]\noutput"), "input[0].dims",
     "the model expects 2 dimensions"),
    ("tf_shared_session", 'platform: "tensorflow_savedmodel"\nmax_batch_size: 4\n' + IO +
     'parameters { key: "MAX_SESSION_SHARE_COUNT" value: { string_value: "2" } }', "parameters.MAX_SESSION_SHARE_COUNT",
     "its own process"),
]


@pytest.fixture(scope="module")
def server(repo):
    wanted = ["mlp_openvino", "mlp_tensorflow", "tf_triple", "tf_batched"]
    with serving(TritondServer(repo, ["--exit-on-error=false", "--strict-readiness=false"]), wait="live",
                 timeout=180) as s:
        wait_for(lambda: all(http_get(f"http://{s.http_url}/v2/models/{m}/ready")[0] == 200 for m in wanted), 180,
                 lambda: f"{wanted} to be ready:\n{s.log}", every=0.2)
        yield s


@pytest.fixture(scope="module")
def http(server):
    c = httpclient.InferenceServerClient(server.http_url, concurrency=8, network_timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def infer(client, model: str, x: np.ndarray, name: str = "INPUT0", out: str = "OUTPUT0") -> np.ndarray:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    inp = module.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy(out)


def openvino_direct(repo: Path, x: np.ndarray) -> np.ndarray:
    core = ov.Core()
    compiled = core.compile_model(str(repo / "mlp_openvino" / "1" / "model.xml"), "CPU",
                                  {ov.properties.hint.inference_precision: ov.Type.f32})
    return compiled.create_infer_request().infer({"INPUT0": x})["OUTPUT0"]


def tensorflow_direct(repo: Path, x: np.ndarray) -> np.ndarray:
    loaded = tf.saved_model.load(str(repo / "mlp_tensorflow" / "1" / "model.savedmodel"))
    return loaded.signatures["serving_default"](INPUT0=tf.constant(x))["OUTPUT0"].numpy()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_mlp_matches_each_framework_called_directly(repo, request, protocol):
    client = request.getfixturevalue(protocol)
    x = np.random.default_rng(0).standard_normal((3, WIDTH)).astype(np.float32)
    np.testing.assert_allclose(infer(client, "mlp_openvino", x), openvino_direct(repo, x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(infer(client, "mlp_tensorflow", x), tensorflow_direct(repo, x), rtol=1e-6, atol=1e-6)


def test_same_inputs_same_outputs_on_all_four_backends(repo, http):
    x = np.random.default_rng(1).standard_normal((5, WIDTH)).astype(np.float32)
    reference = infer(http, "mlp_onnx", x)
    names = [m for m in MLPS if (repo / m).is_dir()]
    for model in names[1:]:
        name, out = ("INPUT__0", "OUTPUT__0") if model == "mlp_torch" else ("INPUT0", "OUTPUT0")
        np.testing.assert_allclose(infer(http, model, x, name, out), reference, rtol=1e-4, atol=1e-4, err_msg=model)


@pytest.mark.parametrize("model", ["ov_batched", "tf_batched"])
def test_dynamic_batching_forms_one_batch(repo, http, model):
    xs = [np.random.default_rng(i).standard_normal((1, WIDTH)).astype(np.float32) for i in range(4)]
    pending = []
    for x in xs:
        inp = httpclient.InferInput("INPUT0", [1, WIDTH], "FP32")
        inp.set_data_from_numpy(x)
        pending.append(http.async_infer(model, [inp]))
    expected = openvino_direct(repo, np.concatenate(xs))
    for i, p in enumerate(pending):
        np.testing.assert_allclose(p.get_result().as_numpy("OUTPUT0"), expected[i:i + 1], rtol=1e-4, atol=1e-4)
    (stats,) = http.get_inference_statistics(model)["model_stats"]
    assert stats["inference_count"] == 4 and stats["execution_count"] == 1
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(4, 1)]


def test_openvino_auto_complete_from_the_ir_and_onnx(http):
    auto = http.get_model_config("ov_auto")
    assert auto["backend"] == "openvino" and auto["max_batch_size"] == 4 and "dynamic_batching" in auto
    assert [(i["name"], i["dims"]) for i in auto["input"] + auto["output"]] == [("INPUT0", [256]), ("OUTPUT0", [256])]
    onnx = http.get_model_config("ov_onnx")       # an ONNX graph has no layout: no batching, as Triton
    assert onnx["max_batch_size"] == 0 and onnx["input"][0]["dims"] == [-1, 256]
    x = np.ones((2, WIDTH), np.float32)
    np.testing.assert_allclose(infer(http, "ov_onnx", x), infer(http, "ov_auto", x), rtol=1e-5, atol=1e-5)


def test_openvino_static_batch_needs_padding(http):
    x = np.ones((1, WIDTH), np.float32)
    with pytest.raises(InferenceServerException, match="expected requests with batch size '4', got '1'"):
        infer(http, "ov_static", x)
    padded = infer(http, "ov_static_padded", x)
    assert padded.shape == (1, WIDTH)
    np.testing.assert_allclose(padded, infer(http, "ov_reshaped", x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(infer(http, "ov_static", np.ones((4, WIDTH), np.float32))[:1], padded, rtol=1e-5)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_savedmodel_signature_and_strings(request, protocol):
    client = request.getfixturevalue(protocol)
    module = httpclient if protocol == "http" else grpcclient
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    text = np.array([[b"ab"], [b"xyz"]], dtype=object)
    inputs = [module.InferInput("x", [2, 4], "FP32"), module.InferInput("text", [2, 1], "BYTES")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(text)
    result = client.infer("tf_triple", inputs)
    np.testing.assert_allclose(result.as_numpy("y"), x * 3.0)
    assert result.as_numpy("length").reshape(-1).tolist() == [2, 3]
    assert result.as_numpy("upper").reshape(-1).tolist() == [b"AB", b"XYZ"]


def test_savedmodel_auto_complete_from_the_signature(http):
    config = http.get_model_config("tf_triple")
    assert config["platform"] == "tensorflow_savedmodel" and config["max_batch_size"] == 4
    shown = {io["name"]: (io["data_type"], io["dims"]) for io in config["input"] + config["output"]}
    assert shown == {"text": ("TYPE_STRING", [1]), "x": ("TYPE_FP32", [4]), "length": ("TYPE_INT32", [1]),
                     "upper": ("TYPE_STRING", [1]), "y": ("TYPE_FP32", [4])}
    assert http.get_model_metadata("tf_triple")["platform"] == "tensorflow_savedmodel"


@pytest.mark.parametrize("model,field,text", [(m, f, t) for m, _, f, t in BROKEN])
def test_config_errors_are_located(http, repo, model, field, text):
    entry = next(e for e in http.get_model_repository_index() if e["name"] == model)
    assert entry["state"] == "UNAVAILABLE"
    assert f"model '{model}'" in entry["reason"] and f"field '{field}'" in entry["reason"], entry["reason"]
    assert text in entry["reason"], entry["reason"]


def maps_of(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_frameworks_load_only_in_their_workers(server):
    for pid in server.role_pids("tritond.broker.main") + server.role_pids("tritond.frontend"):
        loaded = maps_of(pid)
        assert "tensorflow" not in loaded and "openvino" not in loaded, pid
    [tf_worker] = server.worker_pids("mlp_tensorflow")
    [ov_worker] = server.worker_pids("mlp_openvino")
    assert "tensorflow" in maps_of(tf_worker) and "openvino" in maps_of(ov_worker)


@pytest.mark.parametrize("model", ["mlp_openvino", "mlp_tensorflow"])
def test_killed_worker_fails_its_batch_and_is_replaced(server, http, model):
    [victim] = server.worker_pids(model)
    x = np.ones((1, WIDTH), np.float32)
    inp = httpclient.InferInput("INPUT0", [1, WIDTH], "FP32")
    inp.set_data_from_numpy(x)
    os.kill(victim, signal.SIGSTOP)
    pending = http.async_infer(model, [inp])
    # dispatched to the stopped worker (kill it inside the heartbeat grace)
    wait_for(lambda: metric(server, "tritond_broker_inflight_batches") == 1, 10, "the batch to be dispatched",
             every=0.02)
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(InferenceServerException) as failed:
        pending.get_result()
    assert failed.value.status() == "503" and f"'{model}'" in failed.value.message()
    assert "signal 9" in failed.value.message(), failed.value.message()
    wait_for(lambda: http.is_model_ready(model) and server.worker_pids(model), 120,
             lambda: f"{model} ready again:\n{server.log}", every=0.2)
    assert server.worker_pids(model) != [victim]
    assert infer(http, model, x).shape == (1, WIDTH)
    assert http.is_model_ready("mlp_onnx")


def test_without_the_packages_only_those_models_are_unavailable(repo, tmp_path):
    shadow = tmp_path / "shadow"
    for package in ("openvino", "tensorflow"):
        (shadow / package).mkdir(parents=True)
        (shadow / package / "__init__.py").write_text(f'raise ImportError("No module named {package!r}")\n')
    small = tmp_path / "models"
    small.mkdir()
    for name in ("mlp_onnx", "mlp_openvino", "mlp_tensorflow"):
        shutil.copytree(repo / name, small / name)
    s = TritondServer(small, ["--exit-on-error=false", "--strict-readiness=false"], grpc=False,
                      env={"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])})
    with serving(s, wait="live", timeout=120):
        client = httpclient.InferenceServerClient(s.http_url)

        def both_unavailable() -> dict | None:
            index = {e["name"]: e for e in client.get_model_repository_index()}
            return index if all(index[m].get("state") == "UNAVAILABLE" for m in ("mlp_openvino", "mlp_tensorflow")) \
                else None
        index = wait_for(both_unavailable, 60, lambda: f"both framework models to be UNAVAILABLE:\n{s.log}", every=0.2)
        assert "pip install 'tritond[openvino]'" in index["mlp_openvino"]["reason"]
        assert "pip install 'tritond[tensorflow]'" in index["mlp_tensorflow"]["reason"]
        assert infer(client, "mlp_onnx", np.ones((1, WIDTH), np.float32)).shape == (1, WIDTH)
        client.close()


TF_STARTUP_LINES = ("absl::InitializeLog", "oneDNN custom operations are on")


def test_tensorflows_start_up_lines_stay_out_of_the_log(server):
    for line in TF_STARTUP_LINES:
        assert line not in server.log, server.log


def test_tensorflows_start_up_lines_are_verbose_lines(repo, tmp_path):
    small = tmp_path / "models"
    shutil.copytree(repo / "mlp_tensorflow", small / "mlp_tensorflow")
    with serving(TritondServer(small, ["--log-verbose=1"], grpc=False), timeout=180) as s:
        lines = [line for line in s.log.splitlines() if "] TensorFlow: " in line]
        assert any(TF_STARTUP_LINES[1] in line for line in lines), s.log
        assert all(line.startswith("I") for line in lines), lines
