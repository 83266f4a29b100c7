import pytest
from tritonclient.grpc import model_config_pb2

from tritond.repository import devices
from tritond.repository.catalog import load_spec
from tritond.repository.config import load_model_config, validate_config
from tritond.repository.errors import ConfigError
from tritond.repository.layout import ModelSource

Kind = model_config_pb2.ModelInstanceGroup.Kind


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)


def make_model(root, name, config=None, files=("1/model.py",)):
    path = root / name
    path.mkdir()
    for f in files:
        (path / f).parent.mkdir(parents=True, exist_ok=True)
        (path / f).write_text("")
    if config is not None:
        (path / "config.pbtxt").write_text(config)
    return ModelSource(name, str(path), str(root))


def load_and_validate(source, **kw):
    cfg = load_model_config(source, **kw)
    validate_config(cfg, model_path=source.path, config_file=source.path + "/config.pbtxt")
    return cfg


GOOD = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


def test_parse_good_config(tmp_path):
    cfg = load_and_validate(make_model(tmp_path, "m", GOOD))
    assert cfg.name == "m" and cfg.backend == "python" and cfg.max_batch_size == 8
    assert [i.name for i in cfg.input] == ["IN"]
    assert cfg.output[0].data_type == model_config_pb2.TYPE_STRING
    assert cfg.default_model_filename == "model.py"
    assert cfg.version_policy.latest.num_versions == 1
    assert list(cfg.dynamic_batching.preferred_batch_size) == [8]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 100
    assert cfg.optimization.input_pinned_memory.enable and cfg.optimization.output_pinned_memory.enable


def test_parse_error_names_file_line_and_field(tmp_path):
    src = make_model(tmp_path, "m", 'name: "m"\nbackend: "python"\n  bogus_field: 3\n')
    with pytest.raises(ConfigError) as e:
        load_model_config(src)
    assert e.value.file == src.path + "/config.pbtxt"
    assert e.value.field == "bogus_field"
    assert "line 3, column 3" in str(e.value)
    assert str(e.value).startswith(f"model 'm', file '{src.path}/config.pbtxt', field 'bogus_field': ")


def test_two_schedulers_violate_the_oneof(tmp_path):
    src = make_model(tmp_path, "m", 'backend: "python"\ndynamic_batching {}\nsequence_batching {}\n')
    with pytest.raises(ConfigError, match="line 3.*oneof"):
        load_model_config(src)


def test_name_must_match_directory(tmp_path):
    src = make_model(tmp_path, "m", 'name: "other"\nbackend: "python"\n')
    spec = load_spec(src)
    assert "field 'name'" in spec.error
    assert "unexpected directory name 'm' for model 'other'" in spec.error
    assert spec.unpolled, "Triton's repository manager refuses it while polling"


def test_the_directory_name_is_checked_before_the_model_files(tmp_path):
    """As Triton: the repository manager checks the name before the python backend checks its stub
    name or model.py."""
    spec = load_spec(make_model(tmp_path, "modeltest", 'name: "model{test}"\nbackend: "python"\n'))
    assert "unexpected directory name 'modeltest' for model 'model{test}'" in spec.error and spec.unpolled
    spec = load_spec(make_model(tmp_path, "model{test}", 'name: "model{test}"\nbackend: "python"\n'))
    assert "Invalid stub name" in spec.error and not spec.unpolled


def test_an_invalid_config_is_refused_for_that_before_its_name_and_versions(tmp_path):
    """Triton validates the config first (L0_model_config's ensembles have other names, no versions)."""
    src = make_model(tmp_path, "m", 'name: "other"\nplatform: "ensemble"\n' + IO16, files=())
    assert "ensemble scheduling must be set for ensemble other whose platform is ensemble" in load_spec(src).error
    src = make_model(tmp_path, "e", 'platform: "ensemble"\n' + IO16 + 'ensemble_scheduling { step [ { model_name: "x" '
                     'input_map { key: "a" value: "in" } output_map { key: "b" value: "t" } } ] }', files=())
    assert "ensemble output 'out' for ensemble e' is not used" in load_spec(src).error


@pytest.mark.parametrize(
    "filename, backend, platform",
    [
        ("model.py", "python", ""),
        ("model.pt", "pytorch", "pytorch_libtorch"),
        ("model.plan", "tensorrt", "tensorrt_plan"),
    ],
)
def test_backend_autofilled_from_files_without_config(tmp_path, filename, backend, platform):
    cfg = load_model_config(make_model(tmp_path, "m", None, files=(f"1/{filename}",)))
    # as Triton's autofill, which leaves the file name of a model.pt it found unset
    expected = "" if backend == "pytorch" else filename
    assert (cfg.name, cfg.backend, cfg.platform, cfg.default_model_filename) == ("m", backend, platform, expected)


def test_backend_autofill_looks_at_lowest_version(tmp_path):
    cfg = load_model_config(make_model(tmp_path, "m", None, files=("2/model.pt", "10/model.py")))
    assert cfg.backend == "pytorch"


def test_platform_and_backend_derive_each_other(tmp_path):
    cfg = load_model_config(make_model(tmp_path, "a", 'platform: "onnxruntime_onnx"', files=()))
    assert (cfg.backend, cfg.default_model_filename) == ("onnxruntime", "model.onnx")
    cfg = load_model_config(make_model(tmp_path, "b", 'backend: "tensorrt"', files=()))
    assert (cfg.platform, cfg.default_model_filename) == ("tensorrt_plan", "model.plan")


def test_ensemble_platform_gets_no_backend_or_groups(tmp_path):
    cfg = load_model_config(make_model(tmp_path, "e", 'platform: "ensemble"', files=()))
    assert cfg.backend == "" and not cfg.instance_group and not cfg.HasField("optimization")


def test_undeterminable_backend_error(tmp_path):
    src = make_model(tmp_path, "m", None, files=("1/weights.bin",))
    with pytest.raises(ConfigError) as e:
        load_model_config(src)
    assert e.value.field == "backend"
    assert (
        "Invalid model name: Could not determine backend for model 'm' with no backend in model configuration. "
        "Expected model name of the form 'model.<backend_name>'." in str(e.value)
    )


def test_missing_config_needs_autocomplete(tmp_path):
    src = make_model(tmp_path, "m", None)
    with pytest.raises(ConfigError, match="auto-complete is disabled"):
        load_model_config(src, autocomplete=False)


def test_named_config_is_preferred(tmp_path):
    src = make_model(tmp_path, "m", 'backend: "python"\nmax_batch_size: 2')
    (tmp_path / "m" / "configs").mkdir()
    (tmp_path / "m" / "configs" / "big.pbtxt").write_text('backend: "python"\nmax_batch_size: 64')
    assert load_model_config(src, config_name="big").max_batch_size == 64
    assert load_model_config(src, config_name="absent").max_batch_size == 2


def test_override_replaces_the_file(tmp_path):
    src = make_model(tmp_path, "m", 'backend: "python"\nmax_batch_size: 2')
    override = model_config_pb2.ModelConfig(backend="python", max_batch_size=5)
    assert load_model_config(src, override=override).max_batch_size == 5


def test_instance_group_defaults(tmp_path):
    py = load_model_config(make_model(tmp_path, "p", 'backend: "python"'))
    assert [(g.name, g.kind, g.count) for g in py.instance_group] == [("p", Kind.KIND_CPU, 1)]
    onnx = load_model_config(make_model(tmp_path, "o", 'backend: "onnxruntime"', files=()))
    assert [(g.name, g.kind, g.count) for g in onnx.instance_group] == [("o", Kind.KIND_CPU, 2)]
    named = load_model_config(
        make_model(tmp_path, "n", 'backend: "python"\ninstance_group [{ count: 3 }, { kind: KIND_CPU }]')
    )
    assert [(g.name, g.kind, g.count) for g in named.instance_group] == [
        ("n_0", Kind.KIND_CPU, 3),
        ("n_1", Kind.KIND_CPU, 1),
    ]


def test_kind_auto_becomes_gpu_when_a_gpu_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    cfg = load_model_config(make_model(tmp_path, "m", 'backend: "python"'))
    group = cfg.instance_group[0]
    assert (group.kind, list(group.gpus), group.count) == (Kind.KIND_GPU, [0, 1], 1)


def test_preferred_batch_size_default_only_when_batching(tmp_path):
    cfg = load_model_config(make_model(tmp_path, "a", 'backend: "python"\nmax_batch_size: 16\ndynamic_batching {}'))
    assert list(cfg.dynamic_batching.preferred_batch_size) == [16]
    cfg = load_model_config(make_model(tmp_path, "b", 'backend: "python"\ndynamic_batching {}'))
    assert list(cfg.dynamic_batching.preferred_batch_size) == []
    cfg = load_model_config(
        make_model(
            tmp_path, "c", 'backend: "python"\nmax_batch_size: 8\ndynamic_batching { preferred_batch_size: [2, 4] }'
        )
    )
    assert list(cfg.dynamic_batching.preferred_batch_size) == [2, 4]


def test_sequence_idle_default(tmp_path):
    cfg = load_model_config(make_model(tmp_path, "m", 'backend: "python"\nsequence_batching {}'))
    assert cfg.sequence_batching.max_sequence_idle_microseconds == 1_000_000


IO = 'input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]\noutput [{ name: "y" data_type: TYPE_FP32 dims: [4] }]\n'


@pytest.mark.parametrize(
    "config, field, text",
    [
        ('backend: "python"\nmax_batch_size: -1', "max_batch_size", "must be non-negative"),
        ('backend: "python"\ninput [{ data_type: TYPE_FP32 dims: [1] }]', "input[0].name", "must specify 'name'"),
        (
            'backend: "python"\ninput [{ name: "x" data_type: TYPE_FP32 dims: [1] }, '
            '{ name: "x" data_type: TYPE_FP32 dims: [1] }]',
            "input[1].name",
            "more than once",
        ),
        ('backend: "python"\noutput [{ name: "y" dims: [1] }]', "output[0].data_type", "must specify 'data_type'"),
        (
            'backend: "python"\ninput [{ name: "x" data_type: TYPE_FP32 dims: [2, -2] }]',
            "input[0].dims",
            "integer >= 1",
        ),
        ('backend: "python"\ninput [{ name: "x" data_type: TYPE_FP32 dims: [0] }]', "input[0].dims", "integer >= 1"),
        ('backend: "python"\ninput [{ name: "x" data_type: TYPE_FP32 }]', "input[0].dims", "must specify 'dims'"),
        (
            'backend: "python"\ninput [{ name: "x" data_type: TYPE_FP32 dims: [4] reshape { shape: [3] } }]',
            "input[0].reshape",
            "different size",
        ),
        (
            'backend: "python"\nmax_batch_size: 4\ndynamic_batching { preferred_batch_size: [8] }',
            "dynamic_batching.preferred_batch_size[0]",
            "must be <= max batch size for m (8 > 4)",
        ),
        (
            'backend: "python"\nmax_batch_size: 4\ndynamic_batching { priority_levels: 2 }',
            "dynamic_batching.default_priority_level",
            "range [1, 2]",
        ),
        (
            'backend: "python"\nmax_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 1 '
            "priority_queue_policy { key: 3 value: {} } }",
            "dynamic_batching.priority_queue_policy[3]",
            "range [1, 2]",
        ),
        ('backend: "caffe2"', "backend", "unable to find backend library for backend 'caffe2', try specifying runtime"),
        ('platform: "tensorflow_graphdef"', "platform", "GraphDef models"),
        ('backend: "onnxruntime"\nplatform: "pytorch_libtorch"', "platform", "'platform' and 'backend' pair"),
        ('backend: "python"\ninstance_group [{ kind: KIND_GPU }]', "instance_group[0].kind", "no GPUs are available"),
        ('backend: "python"\ninstance_group [{ kind: KIND_CPU gpus: [0] }]', "instance_group[0].gpus", "KIND_CPU"),
        ('platform: "ensemble"\n' + IO, "ensemble_scheduling", "ensemble scheduling must be set"),
        (
            'platform: "ensemble"\n' + IO + 'ensemble_scheduling { step [{ input_map { key: "x" value: "x" } }] }',
            "ensemble_scheduling",
            "must specify 'model_name' in step 0 of ensemble 'm'",
        ),
        (
            'platform: "ensemble"\n' + IO + 'instance_group [{}]\nensemble_scheduling { step [{ model_name: "a" }] }',
            "instance_group",
            "should not be specified for ensemble",
        ),
        (
            'backend: "python"\nmodel_metrics { metric_control [{ histogram_options { buckets: [1] } }] }',
            "model_metrics.metric_control[0]",
            "must specify 'metric_identifier'",
        ),
        (
            'backend: "python"\nmodel_metrics { metric_control [{ metric_identifier { family: "f" } }] }',
            "model_metrics.metric_control[0]",
            "must specify 'histogram_options'",
        ),
        (
            'backend: "python"\nmodel_metrics { metric_control [{ metric_identifier { family: "f" } '
            "histogram_options { buckets: [2, 1] } }] }",
            "model_metrics.metric_control[0].histogram_options",
            "strictly increasing",
        ),
    ],
)
def test_validation_errors_name_the_field(tmp_path, config, field, text):
    src = make_model(tmp_path, "m", config)
    with pytest.raises(ConfigError) as e:
        load_and_validate(src)
    assert e.value.model == "m"
    assert e.value.field == field
    assert text in e.value.message
    assert f"file '{src.path}/config.pbtxt'" in str(e.value)


def test_dynamic_batching_without_max_batch_size_is_allowed(tmp_path):
    config = 'backend: "python"\ndynamic_batching { priority_levels: 2 default_priority_level: 1 }'
    cfg = load_and_validate(make_model(tmp_path, "m", config))
    assert cfg.dynamic_batching.priority_levels == 2


def test_model_file_must_exist_in_each_version(tmp_path):
    src = make_model(tmp_path, "m", 'backend: "pytorch"\nversion_policy { all {} }', files=("1/model.pt", "2/other.pt"))
    cfg = load_model_config(src)
    with pytest.raises(ConfigError) as e:
        validate_config(cfg, model_path=src.path)
    assert e.value.file == f"{src.path}/2/model.pt"
    assert e.value.field == "default_model_filename"
    validate_config(cfg, model_path=src.path, versions=[1])


def test_python_model_needs_its_model_file(tmp_path):
    src = make_model(tmp_path, "m", 'backend: "python"\ndefault_model_filename: "serve.py"')
    with pytest.raises(ConfigError, match="serve.py"):
        load_and_validate(src)
    (tmp_path / "m" / "1" / "serve.py").write_text("")
    load_and_validate(src)


# Triton's words, as its qa suite L0_model_config greps them in the server log
IO16 = 'input [ { name: "in" data_type: TYPE_FP32 dims: [ 16 ] } ]\noutput [ { name: "out" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'


@pytest.mark.parametrize("config, text", [
    ('backend: "python"\nmax_batch_size: 4\ninput [ { name: "in" data_type: TYPE_FP32 dims: [ 1, 3, 2 ] '
     'reshape { shape: [ 5 ] } } ]\noutput [ { name: "out" data_type: TYPE_FP32 dims: [ 1 ] } ]',
     "model input 'in' has different size for dims and reshape for m"),
    # a variable-size dims against a fixed-size reshape: the element counts differ first
    ('backend: "python"\ninput [ { name: "in" data_type: TYPE_FP32 dims: [ -1 ] reshape { shape: [ 2, 8 ] } } ]\n'
     'output [ { name: "out" data_type: TYPE_FP32 dims: [ 1 ] } ]',
     "model input 'in' has different size for dims and reshape for m"),
    ('backend: "python"\nmax_batch_size: -1\n' + IO16, "'max_batch_size' must be non-negative value for m"),
    ('backend: "python"\nmax_batch_size: 8\ndynamic_batching { priority_levels: 3 }\n' + IO16,
     r"default priority level must be in range [1, 3] for m"),
    ('backend: "python"\nensemble_scheduling { step [ { model_name: "x" } ] }\n' + IO16,
     "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble"),
    ('backend: "python"\ninstance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]\n' + IO16,
     "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
    ('backend: "python"\ninstance_group [ { kind: KIND_GPU gpus: [ 42 ] } ]\n' + IO16,
     "instance group m_0 of model m specifies invalid or unsupported gpu id 42. GPUs with at least the minimum "
     "required CUDA compute compatibility of 0.000000 are: none; it has kind KIND_GPU but no GPUs are available"),
    ('platform: "ensemble"\noptimization { }\nensemble_scheduling { step [ { model_name: "x" } ] }\n' + IO16,
     "optimization should not be specified for ensemble 'm'"),
    ('platform: "ensemble"\nmodel_warmup [ { name: "w" batch_size: 1 } ]\n'
     'ensemble_scheduling { step [ { model_name: "x" } ] }\n' + IO16,
     "model_warmup can not be specified for ensemble 'm'"),
])
def test_invalid_configs_are_refused_in_tritons_words(tmp_path, config, text):
    with pytest.raises(ConfigError) as e:
        load_and_validate(make_model(tmp_path, "m", config))
    assert text in str(e.value)


def test_ensemble_config_shows_a_transaction_policy(tmp_path):
    """Triton's ensemble validation sets it, so GET config shows `model_transaction_policy {}`."""
    src = make_model(tmp_path, "e", 'platform: "ensemble"\n' + IO16 + 'ensemble_scheduling { step [ { model_name: '
                     '"x" input_map { key: "a" value: "in" } output_map { key: "b" value: "out" } } ] }', files=())
    assert load_model_config(src).HasField("model_transaction_policy")


def test_unknown_platform_gets_the_backend_of_its_model_file(tmp_path):
    """Triton fills the backend from default_model_filename when the platform names none it knows,
    and then refuses the pair, even with auto-complete off."""
    src = make_model(tmp_path, "m", 'platform: "onnxruntim"\ndefault_model_filename: "model.onnx"\n' + IO16,
                     files=("1/model.onnx",))
    with pytest.raises(ConfigError) as e:
        load_and_validate(src, autocomplete=False)
    assert "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime" in str(e.value)


@pytest.mark.parametrize("runtime, text", [
    ("__invalid_runtime__", "unable to find backend library '__invalid_runtime__' for model 'm'"),
    ("../dummy/libtriton_identity.so",
     "backend library name '../dummy/libtriton_identity.so' escapes backend directory"),
])
def test_runtime_other_than_the_backends_own_is_refused(tmp_path, runtime, text):
    src = make_model(tmp_path, "m", f'backend: "identity"\nruntime: "{runtime}"\n' + IO16, files=())
    (tmp_path / "m" / "1").mkdir()
    with pytest.raises(ConfigError) as e:
        load_and_validate(src)
    assert text in str(e.value) and e.value.field == "runtime"


def test_runtime_naming_the_backends_library_is_accepted(tmp_path):
    src = make_model(tmp_path, "m", 'backend: "python"\nruntime: "libtriton_python.so"\n' + IO16)
    assert load_and_validate(src).runtime == "libtriton_python.so"


def test_identity_backend_needs_no_model_file(tmp_path):
    """As Triton's identity test backend: `model.identity` is autofilled, and no such file is read."""
    src = make_model(tmp_path, "m.identity", None, files=())
    (tmp_path / "m.identity" / "1").mkdir()
    cfg = load_and_validate(src)
    assert (cfg.backend, cfg.default_model_filename) == ("identity", "model.identity")


def test_inputs_and_outputs_wait_for_a_python_models_auto_complete(tmp_path):
    """Triton checks the inputs and outputs after the backend's auto-complete, which may fill them
    (L0_model_config's python/incomplete_output); without the hook they are checked at once."""
    config = 'backend: "python"\noutput [ { name: "OUTPUT0" } ]\n'
    hook = ("class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n        return c\n")
    src = make_model(tmp_path, "m", config)
    (tmp_path / "m" / "1" / "model.py").write_text(hook)
    assert load_spec(src).error == ""
    assert "must specify 'data_type'" in load_spec(src, autocomplete=False).error
    plain = make_model(tmp_path, "p", config)
    (tmp_path / "p" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    assert "model output 'OUTPUT0' must specify 'data_type' for p" in load_spec(plain).error


def test_a_backend_directory_holding_model_py_makes_a_python_based_backend(tmp_path):
    """As Triton: a backend it does not have a library for runs on the Python backend when its
    directory holds model.py; that model.py is the model's code (its versions need none)."""
    backends = tmp_path / "backends"
    (backends / "add_sub").mkdir(parents=True)
    (backends / "add_sub" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    src = make_model(tmp_path, "m", 'backend: "add_sub"\ninput [{ name: "I" data_type: TYPE_FP32 dims: [1] }]\n'
                                    'output [{ name: "O" data_type: TYPE_FP32 dims: [1] }]\n', files=("1/model.json",))
    spec = load_spec(src, backend_directory=str(backends))
    assert not spec.error and spec.config.runtime == "model.py", spec.error
    assert "unable to find backend library for backend 'add_sub'" in load_spec(src, backend_directory=str(tmp_path)).error
    torch_py = make_model(tmp_path, "t", 'backend: "pytorch"\nruntime: "model.py"\n', files=("1/model.pt",))
    assert (f"unable to find Python backend based backend library 'model.py' for model 't', searched: "
            f"'{backends / 'pytorch' / 'model.py'}'") in load_spec(torch_py, backend_directory=str(backends)).error
    (backends / "pytorch").mkdir()
    (backends / "pytorch" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    spec = load_spec(torch_py, backend_directory=str(backends))
    assert not spec.error and spec.config.default_model_filename == "", "the runtime reads the files itself"
