"""Every tritonserver flag is recognised: implemented ones work, the others stop startup with
a clear line or are ignored with a warning (tritond/triton_flags.py), never "unrecognized
arguments"; and the connection-limit flags check their values."""
from __future__ import annotations

import msgspec
import pytest

from tritond import cli
from tritond.connection_limits import GRPC_KEEPALIVE
from tritond.options import UsageError, server_options, start_parser
from tritond.wire.options import ServerOptions
from tritond.triton_flags import FLAGS, REFUSE, WARN

# Every long option of tritonserver (server:src/command_line_parser.cc at 2.73.0) but --help.
TRITONSERVER_FLAGS = """
allow-client-shm allow-cpu-metrics allow-gpu-metrics allow-grpc allow-http allow-metrics allow-sagemaker
allow-vertex-ai backend-config backend-directory buffer-manager-thread-count cache-config cache-directory
cuda-memory-pool-byte-size cuda-virtual-address-size disable-auto-complete-config enable-peer-access
exit-on-error exit-timeout-secs grpc-address grpc-header-forward-pattern grpc-http2-max-ping-strikes
grpc-http2-max-pings-without-data grpc-http2-min-recv-ping-interval-without-data
grpc-infer-allocation-pool-size grpc-infer-response-compression-level grpc-infer-thread-count
grpc-keepalive-permit-without-calls grpc-keepalive-time grpc-keepalive-timeout grpc-max-connection-age
grpc-max-connection-age-grace grpc-max-response-pool-size grpc-port grpc-restricted-protocol grpc-root-cert
grpc-server-cert grpc-server-key grpc-use-ssl grpc-use-ssl-mutual host-policy http-address
http-header-forward-pattern http-max-input-size http-port http-restricted-api http-thread-count id
load-model log-error log-file log-format log-info log-verbose log-warning metrics-address metrics-config
metrics-interval-ms metrics-port min-supported-compute-capability model-config-name model-control-mode
model-load-gpu-limit model-load-retry-count model-load-thread-count model-namespacing model-repository
model-store pinned-memory-pool-byte-size rate-limit rate-limit-resource repoagent-directory
repository-poll-secs response-cache-byte-size reuse-grpc-port reuse-http-port sagemaker-port
sagemaker-safe-port-range sagemaker-thread-count strict-model-config strict-readiness trace-config
trace-count trace-file trace-level trace-log-frequency trace-rate vertex-ai-default-model vertex-ai-port
vertex-ai-thread-count
""".split()

# A value each flag accepts in tritonserver (default: "1").
VALUES = {
    "backend-config": "onnxruntime,default-max-batch-size=8", "cache-config": "local,size=1048576",
    "grpc-address": "127.0.0.1", "http-address": "127.0.0.1", "metrics-address": "127.0.0.1",
    "grpc-restricted-protocol": "health:k=v", "http-restricted-api": "health:k=v", "id": "t",
    "load-model": "m", "model-config-name": "c", "model-control-mode": "explicit", "model-repository": "/m2",
    "model-store": "/m2", "rate-limit": "execution_count", "rate-limit-resource": "R:1",
    "trace-config": "level=TIMESTAMPS", "trace-file": "/tmp/t.json", "trace-level": "TIMESTAMPS",
    "log-file": "/tmp/l.log", "log-format": "ISO8601", "metrics-config": "summary_latencies=true",
    "host-policy": "numa0,numa-node=0", "model-load-gpu-limit": "0:0.5", "cuda-memory-pool-byte-size": "0:1",
    "grpc-infer-response-compression-level": "high", "http-header-forward-pattern": "x-.*",
    "grpc-header-forward-pattern": "x-.*", "cache-directory": "/tmp", "repoagent-directory": "/tmp",
    "backend-directory": "/opt/tritonserver/backends", "vertex-ai-default-model": "m",
    "sagemaker-safe-port-range": "8080-8090", "min-supported-compute-capability": "6.0",
    "grpc-use-ssl": "false", "grpc-use-ssl-mutual": "false", "grpc-server-cert": "", "grpc-server-key": "",
    "grpc-root-cert": "",
}
# What a flag needs beside it to be valid at all.
WITH = {"load-model": ["--model-control-mode=explicit"],
        "grpc-use-ssl-mutual": ["--grpc-use-ssl=false"]}
BASE = ["--model-repository", "/m"]


def options(*args: str) -> ServerOptions:
    return server_options(start_parser().parse_args([*BASE, *args]))


@pytest.mark.parametrize("flag", TRITONSERVER_FLAGS)
def test_every_tritonserver_flag_is_recognised(flag):
    try:
        options(f"--{flag}={VALUES.get(flag, '1')}", *WITH.get(flag, []))
    except UsageError as e:
        assert "unrecognized" not in str(e)
        assert f"'--{flag}' is a tritonserver flag that tritond does not support yet" in str(e), str(e)


@pytest.mark.parametrize("flag", [f for f, spec in FLAGS.items() if spec.decision == REFUSE])
def test_a_flag_that_would_change_behaviour_is_refused(flag):
    with pytest.raises(UsageError, match=f"'{flag}' is a tritonserver flag that tritond does not support yet"):
        options(f"{flag}={VALUES.get(flag[2:], 'true')}")


@pytest.mark.parametrize("flag", [f for f, spec in FLAGS.items() if spec.decision == WARN])
def test_a_tuning_flag_is_ignored_with_a_warning(flag):
    notes = options(f"{flag}=7").startup_notes
    assert notes == [("WARNING", f"'{flag}' is a tritonserver flag that tritond ignores: {FLAGS[flag].why}")]


@pytest.mark.parametrize("flag, value", [(f, v) for f, spec in FLAGS.items() for v in spec.harmless])
def test_a_value_asking_for_nothing_new_is_accepted_silently(flag, value):
    assert options(f"{flag}={value.upper()}").startup_notes == []


def test_backend_directory_is_where_python_based_backends_are():
    assert options().backend_directory == "/opt/tritonserver/backends"
    opts = options("--backend-directory=/b")
    assert opts.backend_directory == "/b" and opts.startup_notes == []


@pytest.mark.parametrize("value", ["0", "-1"])
def test_http_max_input_size_must_be_positive(value):
    with pytest.raises(UsageError, match="--http-max-input-size must be greater than 0"):
        options(f"--http-max-input-size={value}")


def test_connection_limits_default_to_tritonservers_keepalive_and_refuse_bad_values():
    opts = options()
    args = dict(opts.grpc_channel_args)
    for _, arg, default, *_ in GRPC_KEEPALIVE:
        if default:
            assert args[arg] == default
    assert "grpc.max_connection_age_ms" not in args      # 0: no maximum, as tritonserver
    assert args["grpc.keepalive_permit_without_calls"] == 0 and args["grpc.max_concurrent_streams"] == 1024
    assert msgspec.structs.asdict(opts.http_limits) == {
        "max_header_size": 65536, "max_headers": 100, "header_timeout_secs": 10.0, "body_timeout_secs": 60.0,
        "keepalive_timeout_secs": 5.0, "max_connections": 1024}
    for bad in ("--http-max-connections=0", "--http-header-timeout-secs=-1", "--grpc-keepalive-time=-5",
                "--grpc-max-concurrent-streams=0"):
        with pytest.raises(UsageError, match=bad.split("=")[0]):
            options(bad)


def test_the_command_line_says_so_and_exits_1(capsys, tmp_path):
    assert cli.main(["--model-repository", str(tmp_path), "--host-policy", "numa0,numa-node=0"]) == 1
    err = capsys.readouterr().err
    assert "'--host-policy' is a tritonserver flag that tritond does not support yet" in err


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_repository_that_is_not_a_directory_is_one_line_not_a_traceback(capsys, tmp_path, kind):
    path = tmp_path / "models"
    if kind == "file":
        path.write_text("")
    assert cli.main(["--model-repository", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    what = "does not exist" if kind == "missing" else "is not a directory"
    assert err == f"tritond start: error: model repository '{path}' {what}"


def test_tritonservers_deprecated_trace_flags_are_aliases_of_trace_config():
    opts = options("--trace-file=/tmp/t.json", "--trace-level=MIN", "--trace-rate=1", "--trace-count=5",
                   "--trace-log-frequency=2")
    trace = opts.trace
    assert (trace.file, trace.level, trace.rate, trace.count, trace.log_frequency) == \
        ("/tmp/t.json", "TIMESTAMPS", 1, 5, 2)
    # tritonserver's words (L0_cmdline_trace greps for them)
    assert ("WARNING", "Warning: '--trace-file' has been deprecated and will be removed in future releases. "
                       "Please use '--trace-config triton,file=<filepath> instead.") in opts.startup_notes
    # --trace-config wins over the deprecated flag, as in tritonserver
    assert options("--trace-rate=1", "--trace-config=rate=7").trace.rate == 7
    assert options("--trace-level=OFF").trace.level == "OFF"
    tensors = options("--trace-level=TIMESTAMPS", "--trace-level=TENSORS").trace
    assert (tensors.level, tensors.tensors) == ("TIMESTAMPS", True)
    with pytest.raises(UsageError, match="level=TENSORS is not supported in opentelemetry mode"):
        options("--trace-level=TENSORS", "--trace-config=mode=opentelemetry")


@pytest.mark.parametrize("flag, message", [
    ("--http-restricted-api", "restricted api 'health' can not be specified in multiple config groups"),
    ("--grpc-restricted-protocol", "restricted protocol 'health' can not be specified in multiple config groups"),
])
def test_a_restricted_category_in_two_groups_is_refused_with_tritonservers_words(flag, message):
    with pytest.raises(UsageError, match=message):
        options(f"{flag}=model-repository,health:k1=v1", f"{flag}=metadata,health:k2=v2")
    with pytest.raises(UsageError, match="unknown restricted api 'model-reposit'"):
        options("--http-restricted-api=model-reposit,health:k1=v1")


def test_a_usage_error_in_tritonservers_words_is_printed_as_tritonserver_prints_it(capsys, tmp_path):
    assert cli.main(["--model-repository", str(tmp_path), "--http-max-input-size=0"]) == 1
    assert "Error: --http-max-input-size must be greater than 0." in capsys.readouterr().err.splitlines()
