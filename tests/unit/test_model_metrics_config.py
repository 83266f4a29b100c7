"""A config's model_metrics: validated in Triton's words, its first-response buckets used."""
from __future__ import annotations

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tritond.broker.observe.metrics import FIRST_RESPONSE_BUCKETS_MS, latency_factory
from tritond.repository.errors import ConfigError
from tritond.repository.model_metrics import check_model_metrics, model_metrics_warnings
from tritond.wire.options import MetricsConfig

FAMILY = "nv_inference_first_response_histogram_ms"


def config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse('name: "m"\n' + text, model_config_pb2.ModelConfig())


def fail(field: str, message: str) -> ConfigError:
    return ConfigError("m", "config.pbtxt", field, message)


@pytest.mark.parametrize("control, message", [
    ('histogram_options { buckets: [ 1 ] }', "metric control must specify 'metric_identifier'"),
    ('metric_identifier { family: "" } histogram_options { buckets: [ 1 ] }',
     "metric identifier must specify non-empty 'family'"),
    (f'metric_identifier {{ family: "{FAMILY}" }}', "metric control must specify 'histogram_options'"),
    (f'metric_identifier {{ family: "{FAMILY}" }} histogram_options {{ }}',
     "histogram options must specify non-empty 'buckets'"),
])
def test_incomplete_metric_controls_are_refused(control, message):
    with pytest.raises(ConfigError) as e:
        check_model_metrics(config(f"model_metrics {{ metric_control [ {{ {control} }} ] }}"), fail)
    assert e.value.message == message


def test_other_families_are_warned_about():
    cfg = config('model_metrics { metric_control [ { metric_identifier { family: "nv_inference_request_success" } '
                 'histogram_options { buckets: [ 1 ] } } ] }')
    check_model_metrics(cfg, fail)
    assert model_metrics_warnings(cfg) == ["Metric family 'nv_inference_request_success' in 'metric_identifier' is "
                                           "not a customizable metric in Triton core."]


def test_first_response_histogram_takes_the_configs_buckets():
    cfg = config(f'model_metrics {{ metric_control [ {{ metric_identifier {{ family: "{FAMILY}" }} '
                 'histogram_options { buckets: [ 1, 2, 4, 8 ] } } ] }')
    as_dict = json_format.MessageToDict(cfg, preserving_proto_field_name=True)
    make = latency_factory(MetricsConfig(histogram_latencies=True))
    assert make(as_dict).first_response.bounds == (1.0, 2.0, 4.0, 8.0)
    assert make({"name": "n"}).first_response.bounds == FIRST_RESPONSE_BUCKETS_MS
