"""--http-header-forward-pattern / --grpc-header-forward-pattern: the headers (gRPC metadata)
whose names match reach a Python model in `request.parameters()`, as Triton forwards them
(case-insensitive search, reserved names refused, a header wins over a body parameter of its
name), through tritonclient's `headers=` on HTTP, gRPC and a gRPC stream."""
import json
import queue
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, expect_error, serving

MODEL = textwrap.dedent('''
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "PARAMS", np.array([r.parameters().encode()], dtype=object))]) for r in requests]
''')
CONFIG = textwrap.dedent('''
    name: "params"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
''')
HEADERS = {"my_header_1": "my_value_1", "MY_HEADER_2": 'a "quoted" value\\ ', "other": "x"}
RESERVED = "is reserved for Triton usage and cannot be forwarded."


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("forward") / "models"
    (root / "params" / "1").mkdir(parents=True)
    (root / "params" / "config.pbtxt").write_text(CONFIG)
    (root / "params" / "1" / "model.py").write_text(MODEL)
    return root


def _inputs(module):
    t = module.InferInput("INPUT0", [1], "FP32")
    t.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    return [t]


def _params(result) -> dict:
    return json.loads(result.as_numpy("PARAMS")[0])


def http_params(server, headers=None, parameters=None) -> dict:
    """(tritonclient.http adds its own headers to the dict it is given.)"""
    c = httpclient.InferenceServerClient(server.http_url)
    try:
        return _params(c.infer("params", _inputs(httpclient), headers=dict(headers or {}), parameters=parameters))
    finally:
        c.close()


def grpc_params(server, headers=None, parameters=None) -> dict:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return _params(c.infer("params", _inputs(grpcclient), headers=headers, parameters=parameters))
    finally:
        c.close()


def stream_params(server, headers=None) -> list:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    replies: queue.Queue = queue.Queue()
    try:
        c.start_stream(lambda result, error: replies.put(error or result), headers=headers)
        for _ in range(2):
            c.async_stream_infer("params", _inputs(grpcclient))
        out = [replies.get(timeout=60) for _ in range(2)]
        c.stop_stream()
        return out
    finally:
        c.close()


@pytest.fixture(scope="module")
def forwarding(repo):
    with serving(TritondServer(repo, ["--http-header-forward-pattern", "MY_HEADER.*",
                                      "--grpc-header-forward-pattern", "MY_HEADER.*"])) as s:
        yield s


def test_matching_http_headers_reach_the_model_case_insensitively(forwarding):
    params = http_params(forwarding, HEADERS, {"key": "v"})
    # ASGI servers hand header names over lower-cased
    assert params == {"key": "v", "my_header_1": "my_value_1", "my_header_2": 'a "quoted" value\\ '}


def test_matching_grpc_metadata_reaches_the_model(forwarding):
    params = grpc_params(forwarding, {k.lower(): v for k, v in HEADERS.items()}, {"key": 3})
    assert params == {"key": 3, "my_header_1": "my_value_1", "my_header_2": 'a "quoted" value\\ '}


def test_a_stream_forwards_its_metadata_to_every_request(forwarding):
    for result in stream_params(forwarding, {"my_header_1": "s"}):
        assert _params(result) == {"my_header_1": "s"}


def test_a_forwarded_header_wins_over_the_body_parameter_of_its_name(forwarding):
    assert http_params(forwarding, {"my_header_1": "header"}, {"my_header_1": "body"}) == {"my_header_1": "header"}
    assert grpc_params(forwarding, {"my_header_1": "header"}, {"my_header_1": "body"}) == {"my_header_1": "header"}


def test_without_a_pattern_no_header_is_forwarded(repo):
    with serving(TritondServer(repo)) as s:
        assert http_params(s, HEADERS) == {}
        assert grpc_params(s, {k.lower(): v for k, v in HEADERS.items()}) == {}


def test_case_sensitive_pattern_and_reserved_names(repo):
    with serving(TritondServer(repo, ["--grpc-header-forward-pattern", "(?-i)MY_HEADER.*",
                                      "--http-header-forward-pattern", ".*"])) as s:
        assert grpc_params(s, {"my_header_1": "v"}) == {}
        for name in ("sequence_id", "priority", "binary_data_output", "triton_anything"):
            e = expect_error(lambda: http_params(s, {name: "1"}), 400)
            assert f"Header '{name}' {RESERVED}" in e.message()
        assert http_params(s, {"my_header_1": "v"})["my_header_1"] == "v"


def test_reserved_metadata_fails_the_request_and_each_request_of_a_stream(repo):
    with serving(TritondServer(repo, ["--grpc-header-forward-pattern", ".*"])) as s:
        e = expect_error(lambda: grpc_params(s, {"timeout": "1"}), protocol="grpc", grpc_code="INVALID_ARGUMENT")
        assert f"Header 'timeout' {RESERVED}" in e.message()
        for reply in stream_params(s, {"headers": "x"}):
            assert f"Header 'headers' {RESERVED}" in reply.message()


def test_an_invalid_pattern_stops_startup(repo):
    s = TritondServer(repo, ["--http-header-forward-pattern", "MY_(HEADER"]).start(wait="exit")
    assert s.returncode == 1
    assert "--http-header-forward-pattern: invalid regular expression" in s.log
