import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritond.repository.spec import ModelSpec
from tritond.repository.ensemble import decoupled_branching_error, validate_ensemble


def parse(text):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def spec(name, text, error=""):
    cfg = None if error else parse(f'name: "{name}" ' + text)
    return ModelSpec(name, f"/repo/{name}", cfg, [1] if cfg else [], error)


# pre: FP32 IN -> FP32 OUT, post: FP32 IN -> INT64 OUT, pyraw: python model not auto-completed yet.
SPECS = {
    "pre": spec("pre", 'backend: "onnxruntime" input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }] '
                'output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }]'),
    "post": spec("post", 'backend: "python" max_batch_size: 2 input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }] '
                 'output [{ name: "OUT" data_type: TYPE_INT64 dims: [1] }]'),
    "pyraw": spec("pyraw", 'backend: "python"'),
    "broken": spec("broken", "", error="model 'broken', file 'x', field 'backend': bad"),
}

IO = """
name: "ens"
platform: "ensemble"
input [{ name: "RAW" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "LABEL" data_type: TYPE_INT64 dims: [1] }]
"""


def step(model, inputs, outputs):
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" {ins} {outs} }}'


def ensemble(*steps):
    return parse(IO + "ensemble_scheduling { step [" + ", ".join(steps) + "] }")


GOOD = (step("pre", {"IN": "RAW"}, {"OUT": "MID"}), step("post", {"IN": "MID"}, {"OUT": "LABEL"}))


def test_valid_ensemble():
    assert validate_ensemble(ensemble(*GOOD), SPECS) is None
    assert validate_ensemble(ensemble(*reversed(GOOD)), SPECS) is None


def test_python_composing_model_not_yet_autocompleted_is_accepted():
    steps = (step("pre", {"IN": "RAW"}, {"OUT": "MID"}), step("pyraw", {"A": "MID"}, {"B": "LABEL"}))
    assert validate_ensemble(ensemble(*steps), SPECS) is None


@pytest.mark.parametrize(
    "steps, expected",
    [
        ((), "must specify 'step' for ensemble 'ens'"),
        ((step("pre", {}, {"OUT": "LABEL"}),), "must specify 'input_map' in step 0"),
        (
            (step("pre", {"IN": "RAW"}, {"OUT": "MID"}), step("post", {"IN": "MID"}, {"OUT": "MID"})),
            "ensemble tensor 'MID' can appear in an output map only once for ensemble 'ens' step 1",
        ),
        (
            (step("pre", {"IN": "RAW"}, {"OUT": "MID"}), step("post", {"IN": "NOWHERE"}, {"OUT": "LABEL"})),
            "output 'LABEL' for ensemble 'ens' is not written: at least one of its depending tensors, 'NOWHERE', "
            "is not connected",
        ),
        (
            (step("pre", {"IN": "RAW"}, {"OUT": "MID"}),),
            "ensemble output 'LABEL' for ensemble ens' is not used",
        ),
        ((step("post", {"IN": "MID"}, {"OUT": "LABEL"}),), "ensemble input 'RAW' for ensemble ens' is not used"),
        (
            (
                step("pre", {"IN": "RAW"}, {"OUT": "LABEL"}),
                step("pre", {"IN": "B"}, {"OUT": "A"}),
                step("post", {"IN": "A"}, {"OUT": "B"}),
            ),
            "ensemble tensor 'A' is unused in ensemble 'ens'",
        ),
        (
            (step("pre", {"IN": "RAW"}, {"OUT": "MID"}), step("nosuch", {"IN": "MID"}, {"OUT": "LABEL"})),
            "ensemble ens contains models that are not available or ambiguous: nosuch",
        ),
        (
            (step("pre", {"IN": "RAW"}, {"OUT": "MID"}), step("broken", {"IN": "MID"}, {"OUT": "LABEL"})),
            "ensemble 'ens' depends on 'broken' which has no loaded version. Model 'broken' loading failed with "
            "error: model 'broken'",
        ),
        (
            (step("post", {"IN": "RAW"}, {"OUT": "MID"}), step("post", {"IN": "MID"}, {"OUT": "LABEL"})),
            "in ensemble ens, ensemble tensor MID: inconsistent data type: TYPE_INT64 is inferred from model post while "
            "TYPE_FP32 is inferred from model post",
        ),
        (
            (step("pre", {"IN": "RAW"}, {"OUT": "MID"}), step("post", {"WRONG": "MID"}, {"OUT": "LABEL"})),
            "in ensemble ens, ensemble tensor MID is mapping to non-existing input WRONG in model post",
        ),
        (
            (step("pre", {"IN": "RAW"}, {"OUT": "MID"}), step("post", {"IN": "MID"}, {"NOPE": "LABEL"})),
            "in ensemble ens, ensemble tensor LABEL is mapped from non-existing output NOPE in model post",
        ),
    ],
)
def test_ensemble_errors(steps, expected):
    error = validate_ensemble(ensemble(*steps), SPECS)
    assert error is not None and expected in error


def test_ensemble_output_type_must_match_producer():
    cfg = ensemble(step("pre", {"IN": "RAW"}, {"OUT": "LABEL"}))
    assert "TYPE_INT64 is inferred from model ens while TYPE_FP32 is inferred from model pre" in validate_ensemble(
        cfg, SPECS
    )


def test_unmapped_required_input():
    specs = dict(SPECS)
    specs["two"] = spec(
        "two",
        'backend: "python" input [{ name: "A" data_type: TYPE_FP32 dims: [4] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [4] }] output [{ name: "C" data_type: TYPE_INT64 dims: [1] }]',
    )
    error = validate_ensemble(ensemble(step("two", {"A": "RAW"}, {"C": "LABEL"})), specs)
    assert "in ensemble ens, input B in model two is not mapped to any ensemble tensors" in error


def test_ensemble_batch_size_bounded_by_composing_models():
    cfg = ensemble(*GOOD)
    cfg.max_batch_size = 8
    error = validate_ensemble(cfg, SPECS)
    assert (
        "ensemble ens allows maximum batch size 8, but it contains model post "
        "which only allows maximum batch size to be 2" in error
    )


def _fanout(name, steps, outputs):
    text = (f'name: "{name}" platform: "ensemble" input [{{ name: "IN" data_type: TYPE_INT32 dims: [-1] }}] '
            + " ".join(f'output [{{ name: "{o}" data_type: TYPE_INT32 dims: [1] }}]' for o in outputs)
            + " ensemble_scheduling { step [ "
            + ", ".join(f'{{ model_name: "{m}" input_map {{ key: "IN" value: "{i}" }} output_map {{ key: "OUT" '
                        f'value: "{o}" }} }}' for m, i, o in steps) + " ] }")
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_responses_of_different_decoupled_steps_cannot_meet():
    """Triton's decoupled-label rule (L0_model_config's invalid_decoupled_branching cases)."""
    both_out = _fanout("two", [("rep", "IN", "A"), ("rep", "IN", "B")], ["A", "B"])
    assert decoupled_branching_error(both_out, {"rep"}) == (
        "in ensemble two, step of model 'two' receives inputs originated from different decoupled models")
    assert decoupled_branching_error(both_out, set()) is None
    one = _fanout("one", [("rep", "IN", "A"), ("plain", "A", "B")], ["B"])
    assert decoupled_branching_error(one, {"rep"}) is None
