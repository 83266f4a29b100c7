"""ONNX Runtime settings read from a config as Triton's onnxruntime backend reads them."""
import pytest

from tritond.workers.backends.onnxruntime_options import ort_settings


def _config(params=None, **optimization):
    return {"parameters": {k: {"string_value": v} for k, v in (params or {}).items()},
            "optimization": optimization}


@pytest.mark.parametrize("level, name", [(-1, "ORT_ENABLE_BASIC"), (0, "ORT_ENABLE_ALL"), (1, "ORT_ENABLE_EXTENDED"),
                                         (2, "ORT_DISABLE_ALL"), (7, "ORT_ENABLE_ALL")])
def test_the_graph_level_maps_as_tritons_backend_maps_it(level, name):
    assert ort_settings(_config(graph={"level": level}), "m").graph_level == name


def test_nothing_asked_is_onnx_runtimes_defaults():
    s = ort_settings({}, "m")
    assert (s.parallel, s.mem_arena, s.mem_pattern, s.session_entries, s.run_entries, s.log_lines) == (
        False, None, None, (), (), ())


def test_parameters_become_settings_and_triton_log_lines():
    s = ort_settings(_config({"enable_mem_arena": "OFF", "enable_mem_pattern": "true", "execution_mode": "1",
                              "memory.enable_memory_arena_shrinkage": "cpu:0"}), "m")
    assert (s.mem_arena, s.mem_pattern, s.parallel) == (False, True, True)
    assert s.run_entries == (("memory.enable_memory_arena_shrinkage", "cpu:0"),)
    assert s.log_lines == ("Configuring enable_mem_arena to OFF", "Configuring enable_mem_pattern to true",
                           "Configuring memory.enable_memory_arena_shrinkage to cpu:0")


@pytest.mark.parametrize("params, why", [({"execution_mode": "x"}, "failed to convert 'x' to integral number"),
                                         ({"enable_mem_pattern": "2"}, "failed to convert '2' to boolean value")])
def test_values_tritons_backend_cannot_parse_are_refused(params, why):
    with pytest.raises(ValueError, match=why):
        ort_settings(_config(params), "m")
