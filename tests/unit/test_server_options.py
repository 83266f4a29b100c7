"""The server options as one typed Struct (wire/options.py): what the command line builds, what
travels to every process, and what a process refuses to start with."""
from __future__ import annotations

import os

import msgspec
import pytest

from tritond.options import server_options, start_parser
from tritond.wire import options as wire_options
from tritond.wire.options import DEFAULTS, ServerOptions, TlsConfig

BASE = ["--model-repository", "/m"]
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
CERT, KEY, ROOT = (os.path.abspath(p) for p in ("c.pem", "k.pem", "r.pem"))
HTTP_MUTUAL = ["--http-use-ssl-mutual", "--http-server-cert=c.pem", "--http-server-key=k.pem", "--http-root-cert=r.pem"]
GRPC_MUTUAL = ["--grpc-use-ssl-mutual", "--grpc-server-cert=c.pem", "--grpc-server-key=k.pem", "--grpc-root-cert=r.pem"]


def options(*args: str) -> ServerOptions:
    return server_options(start_parser().parse_args([*BASE, *args]))


def channel(arg: str):
    return lambda o: dict(o.grpc_channel_args).get(arg)


# (flags, where they land, what lands there): a value unlike the bare command line's
CASES = [
    (["--model-store=/n"], lambda o: o.model_repositories, ["/m", "/n"]),
    (["--id=edge"], lambda o: o.server_name, "edge"),
    (["--http-address=0.0.0.0"], lambda o: o.http_address, "0.0.0.0"),
    (["--http-port=1"], lambda o: o.http_port, 1),
    (["--grpc-address=0.0.0.0"], lambda o: o.grpc_address, "0.0.0.0"),
    (["--grpc-port=2"], lambda o: o.grpc_port, 2),
    (["--metrics-address=10.0.0.1"], lambda o: o.metrics_address, "10.0.0.1"),
    (["--metrics-port=3"], lambda o: o.metrics_port, 3),
    (["--allow-metrics=false"], lambda o: o.metrics_port, 0),
    (["--allow-http=false"], lambda o: o.allow_http, False),
    (["--allow-grpc=false"], lambda o: o.allow_grpc, False),
    (["--http-server=hypercorn"], lambda o: o.http_server, "hypercorn"),
    (["--http-workers=2"], lambda o: o.http_workers, 2),
    (["--grpc-workers=2"], lambda o: o.grpc_workers, 2),
    (["--broker-shards=3"], lambda o: o.broker_shards, 3),
    (["--http-max-input-size=5"], lambda o: o.http_max_input_size, 5),
    (["--http-header-forward-pattern=x-.*"], lambda o: (o.http_header_forward, o.grpc_header_forward), ("x-.*", None)),
    (["--grpc-header-forward-pattern=(?-i)X"], lambda o: o.grpc_header_forward, "(?-i)X"),
    (["--http-restricted-api=model-repository:K=v"], lambda o: o.http_restricted, {"model-repository": ("k", "v")}),
    (["--grpc-restricted-protocol=health:k=v"], lambda o: o.grpc_restricted, {"health": ("k", "v")}),
    (["--grpc-use-ssl", "--grpc-server-cert=c.pem", "--grpc-server-key=k.pem"], lambda o: o.grpc_tls,
     TlsConfig(cert=CERT, key=KEY)),
    (GRPC_MUTUAL, lambda o: o.grpc_tls, TlsConfig(cert=CERT, key=KEY, root=ROOT, mutual=True)),
    (["--http-use-ssl", "--http-server-cert=c.pem", "--http-server-key=k.pem"], lambda o: o.http_tls,
     TlsConfig(cert=CERT, key=KEY)),
    (HTTP_MUTUAL, lambda o: o.http_tls, TlsConfig(cert=CERT, key=KEY, root=ROOT, mutual=True)),
    ([*HTTP_MUTUAL, "--metrics-use-ssl"], lambda o: o.metrics_tls, TlsConfig(cert=CERT, key=KEY, root=ROOT, mutual=True)),
    ([*HTTP_MUTUAL, "--http-restricted-api-subject=statistics:CN=ops"], lambda o: o.http_restricted_subjects,
     {"statistics": ["CN=ops"]}),
    ([*GRPC_MUTUAL, "--grpc-restricted-protocol-subject=health:CN=ops"], lambda o: o.grpc_restricted_subjects,
     {"health": ["CN=ops"]}),
    (["--openai-port=9"], lambda o: o.openai and (o.openai.port, o.openai.address), (9, "127.0.0.1")),
    (["--openai-port=9", "--openai-address=0.0.0.0"], lambda o: o.openai and o.openai.address, "0.0.0.0"),
    (["--openai-port=9", "--openai-restricted-api", "inference,health", "K", "v"],
     lambda o: o.openai and o.openai.restricted, {"inference": ("k", "v"), "health": ("k", "v")}),
    (["--openai-port=9", f"--tokenizer={FIXTURES}/tokenizer"], lambda o: o.openai and o.openai.tokenizer,
     f"{FIXTURES}/tokenizer"),
    (["--openai-port=9", f"--chat-template={FIXTURES}/chat_template.jinja"],
     lambda o: o.openai and o.openai.chat_template, f"{FIXTURES}/chat_template.jinja"),
    (["--openai-port=9", "--default-max-tokens=5"], lambda o: o.openai and o.openai.default_max_tokens, 5),
    (["--openai-port=9"], lambda o: o.openai and o.openai.default_max_tokens, 16),
    (["--openai-port=8000", "--allow-http=false"], lambda o: o.openai and o.openai.port, 8000),
    (["--openai-port=8001", "--allow-grpc=false"], lambda o: o.openai and o.openai.port, 8001),
    (["--openai-port=8002", "--allow-metrics=false"], lambda o: o.openai and o.openai.port, 8002),
    (["--openai-port=9", "--tool-call-parser=llama3"], lambda o: o.openai and o.openai.tool_call_parser, "llama3"),
    (["--openai-port=9", *HTTP_MUTUAL], lambda o: o.openai and o.openai.tls,
     TlsConfig(cert=CERT, key=KEY, root=ROOT, mutual=True)),
    (["--log-verbose=2"], lambda o: (o.log_verbose, o.log.verbose), (2, 2)),
    (["--exit-timeout-secs=5"], lambda o: o.exit_timeout_secs, 5.0),
    (["--broker-hang-timeout-secs=5"], lambda o: o.broker_hang_timeout_secs, 5.0),
    (["--exit-on-error=false"], lambda o: o.exit_on_error, False),
    (["--strict-readiness=false"], lambda o: o.strict_readiness, False),
    (["--allow-client-shm"], lambda o: o.allow_client_shm, True),
    (["--model-control-mode=poll"], lambda o: o.model_control_mode, "poll"),
    (["--model-control-mode=explicit", "--load-model=a"], lambda o: o.load_models, ["a"]),
    (["--model-control-mode=paged", "--model-memory-budget=1000", "--load-model=a"],
     lambda o: (o.model_control_mode, o.model_memory_budget, o.load_models), ("paged", 1000, ["a"])),
    (["--model-control-mode=paged", "--model-memory-budget=1000", "--model-gpu-memory-budget=0:500",
      "--model-gpu-memory-budget=1:600"], lambda o: o.model_gpu_memory_budget, {0: 500, 1: 600}),
    (["--repository-poll-secs=3"], lambda o: o.repository_poll_secs, 3),
    (["--model-load-thread-count=2"], lambda o: o.model_load_thread_count, 2),
    (["--model-unload-timeout-secs=2"], lambda o: o.model_unload_timeout_secs, 2.0),
    (["--model-file-override-max-bytes=10"], lambda o: o.model_file_override_max_bytes, 10),
    (["--rate-limit=execution_count"], lambda o: o.rate_limit, "execution_count"),
    (["--rate-limit-resource=R:1"], lambda o: o.rate_limit_resources, ["R:1"]),
    (["--model-config-name=h100"], lambda o: o.model_config_name, "h100"),
    (["--backend-directory=/opt/b"], lambda o: o.backend_directory, "/opt/b"),
    (["--disable-auto-complete-config"], lambda o: o.disable_auto_complete, True),
    (["--strict-model-config=true"], lambda o: o.disable_auto_complete, True),
    (["--backend-config=onnxruntime,default-max-batch-size=8"], lambda o: o.default_max_batch_size,
     {"": 4, "onnxruntime": 8}),
    (["--mps"], lambda o: o.mps, True),
    (["--mps-active-thread-percentage=50"], lambda o: o.mps_active_thread_percentage, 50),
    (["--worker-templates=false"], lambda o: o.worker_templates, False),
    (["--log-file={tmp}/log"], lambda o: o.log.file, "{tmp}/log"),
    (["--log-format=json"], lambda o: o.log.format, "json"),
    (["--log-info=false"], lambda o: o.log.info, False),
    (["--log-warning=false"], lambda o: o.log.warning, False),
    (["--log-error=false"], lambda o: o.log.error, False),
    (["--metrics-config=histogram_latencies=true"], lambda o: o.metrics.histogram_latencies, True),
    (["--metrics-interval-ms=10"], lambda o: o.metrics.interval_ms, 10.0),
    (["--allow-cpu-metrics=false"], lambda o: o.cpu_metrics, False),
    (["--allow-gpu-metrics=false"], lambda o: o.gpu_metrics, False),
    (["--trace-config=opentelemetry,resource=a=b"], lambda o: o.trace.otel.resource, {"a": "b"}),
    (["--trace-file=/t.json"], lambda o: o.trace.file, "/t.json"),
    (["--trace-level=TIMESTAMPS"], lambda o: o.trace.level, "TIMESTAMPS"),
    (["--trace-rate=3"], lambda o: o.trace.rate, 3),
    (["--trace-count=4"], lambda o: o.trace.count, 4),
    (["--trace-log-frequency=2"], lambda o: o.trace.log_frequency, 2),
    (["--cache-config=local,size=10"], lambda o: o.cache_size, 10),
    (["--response-cache-byte-size=10"], lambda o: o.cache_size, 10),
    (["--http-max-header-size=10"], lambda o: o.http_limits.max_header_size, 10),
    (["--http-max-headers=10"], lambda o: o.http_limits.max_headers, 10),
    (["--http-header-timeout-secs=1"], lambda o: o.http_limits.header_timeout_secs, 1.0),
    (["--http-body-timeout-secs=1"], lambda o: o.http_limits.body_timeout_secs, 1.0),
    (["--http-keepalive-timeout-secs=1"], lambda o: o.http_limits.keepalive_timeout_secs, 1.0),
    (["--http-max-connections=10"], lambda o: o.http_limits.max_connections, 10),
    (["--grpc-keepalive-time=5"], channel("grpc.keepalive_time_ms"), 5),
    (["--grpc-keepalive-timeout=5"], channel("grpc.keepalive_timeout_ms"), 5),
    (["--grpc-http2-max-pings-without-data=5"], channel("grpc.http2.max_pings_without_data"), 5),
    (["--grpc-http2-min-recv-ping-interval-without-data=5"], channel("grpc.http2.min_ping_interval_without_data_ms"),
     5),
    (["--grpc-http2-max-ping-strikes=5"], channel("grpc.http2.max_ping_strikes"), 5),
    (["--grpc-max-connection-age=5"], channel("grpc.max_connection_age_ms"), 5),
    (["--grpc-max-connection-age-grace=5"], channel("grpc.max_connection_age_grace_ms"), 5),
    (["--grpc-keepalive-permit-without-calls"], channel("grpc.keepalive_permit_without_calls"), 1),
    (["--grpc-max-concurrent-streams=5"], channel("grpc.max_concurrent_streams"), 5),
]


@pytest.mark.parametrize("flags, pick, expected", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_each_flag_lands_in_a_field(flags, pick, expected, tmp_path):
    flags = [f.format(tmp=tmp_path) for f in flags]
    expected = expected.format(tmp=tmp_path) if isinstance(expected, str) else expected
    assert pick(options(*flags)) == expected != pick(options())


def test_every_flag_of_the_parser_has_a_case():
    """A new flag needs its case above (tritonserver's flags tritond does not implement are
    triton_flags.py's, and produce startup notes or usage errors, not fields)."""
    covered = {f.split("=")[0] for flags, _, _ in CASES for f in flags}
    parser = start_parser()
    for action in parser._actions:
        if action.dest in ("help",) or action.dest.startswith("triton_"):
            continue
        assert set(action.option_strings) & covered, f"{action.option_strings[0]} has no case"


def test_a_bare_command_line_gives_the_fields_defaults():
    bare = options()
    # computed from other flags: the metrics address is the HTTP one; gRPC gets tritonserver's keepalive
    expected = msgspec.structs.replace(DEFAULTS, model_repositories=["/m"], metrics_address=DEFAULTS.http_address,
                                       grpc_channel_args=bare.grpc_channel_args)
    assert bare == expected


def test_the_options_round_trip_as_one_argument():
    opts = msgspec.structs.replace(
        options(*HTTP_MUTUAL, "--metrics-use-ssl", "--trace-config=opentelemetry,resource=a=b",
                "--metrics-config=summary_quantiles=0.5:0.05", "--http-restricted-api=health:k=v",
                "--backend-config=default-max-batch-size=2", "--mps-active-thread-percentage=20"),
        server_id="abc", run_dir="/tmp/run", supervisor_pid=7, mps_env={"CUDA_MPS_PIPE_DIRECTORY": "/p"}, ready_fd=5)
    text = wire_options.encode(opts)
    assert isinstance(text, str) and "\0" not in text
    assert wire_options.decode(text) == opts
    assert wire_options.decode(text.encode()) == opts
    assert wire_options.decode(wire_options.encode(DEFAULTS)) == DEFAULTS


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(bogus=1), "Object contains unknown field `bogus`"),
    (lambda d: d.update(http_port="8000"), r"Expected `int`, got `str` - at `\$.http_port`"),
    (lambda d: d["trace"].update(level="LOUD"), r"Invalid enum value 'LOUD' - at `\$.trace.level`"),
    (lambda d: d["http_limits"].update(max_headers_count=1), r"unknown field `max_headers_count` - at `\$.http_limits`"),
    (lambda d: d.update(http_tls={"cert": "c"}), r"missing required field `key` - at `\$.http_tls`"),
    (lambda d: d.pop("model_repositories"), "missing required field `model_repositories`"),
])
def test_an_unknown_key_or_a_wrong_type_is_refused_by_name(change, message):
    values = msgspec.to_builtins(options())
    change(values)
    with pytest.raises(msgspec.ValidationError, match=message):
        wire_options.decode(msgspec.json.encode(values))
    with pytest.raises(msgspec.ValidationError, match=message):
        wire_options.build(values)


def test_strict_model_config_warns_as_tritonserver_does():
    """tritonserver's deprecation warnings, word for word (L0_model_config greps for them)."""
    deprecated = ("WARNING", "Warning: '--strict-model-config' has been deprecated! Please use "
                             "'--disable-auto-complete-config' instead.")
    override = ("WARNING", "Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
                           "'--disable-auto-complete-config'!")
    assert deprecated in options("--strict-model-config=true").startup_notes
    notes = options("--disable-auto-complete-config", "--strict-model-config=false").startup_notes
    assert deprecated in notes and override in notes
    assert options("--disable-auto-complete-config").startup_notes == []


def test_model_config_name_given_empty_is_refused():
    """As tritonserver: '--model-config-name=' is an error, not the default config.pbtxt."""
    from tritond.options import UsageError
    assert options("--model-config-name=h100").model_config_name == "h100"
    assert options().model_config_name == ""
    with pytest.raises(UsageError, match="Error: empty argument for --model-config-name"):
        options("--model-config-name=")


def test_model_control_mode_is_case_insensitive():
    """tritonserver lowercases it (L0_model_namespacing passes POLL and EXPLICIT)."""
    assert options("--model-control-mode=EXPLICIT").model_control_mode == "explicit"
    assert options("--model-control-mode=Poll").model_control_mode == "poll"


@pytest.mark.parametrize("setting, message", [
    (",default-max-batch-size=3", "No backend specified. --backend-config option format is <backend name>,<setting>="
                                  "<value> or <setting>=<value>. Got ,default-max-batch-size=3"),
    ("default-max-batch-size=", "--backend-config option format is '<backend name>,<setting>=<value>'. Got "
                                "default-max-batch-size="),
    ("default-max-batch-size", "--backend-config option format is '<backend name>,<setting>=<value>'. Got "
                               "default-max-batch-size"),
])
def test_malformed_backend_config_is_refused_in_tritonservers_words(setting, message):
    """L0_backend_config greps for these."""
    from tritond.options import UsageError
    with pytest.raises(UsageError) as e:
        options(f"--backend-config={setting}")
    assert str(e.value) == message


@pytest.mark.parametrize("flags, message", [
    ([f"--tokenizer={FIXTURES}/tokenizer"], "--tokenizer need --openai-port"),
    (["--openai-port=8000"], "--openai-port 8000 is also --http-port"),
    (["--openai-port=9", "--openai-restricted-api", "infer", "k", "v"], "Unknown API 'infer'. Available APIs: "),
    (["--openai-port=9", "--openai-restricted-api", "health", "k", "v", "--openai-restricted-api", "health", "j", "w"],
     "restricted api 'health' can not be specified in multiple config groups"),
    (["--openai-port=9", "--tokenizer=/nonexistent"], "not a directory"),
    (["--openai-port=9", "--default-max-tokens=0"], "--default-max-tokens must be at least 1"),
    (["--default-max-tokens=5"], "--default-max-tokens need --openai-port"),
    (["--default-max-tokens=16"], "--default-max-tokens need --openai-port"),
])
def test_openai_flags_are_checked_before_anything_starts(flags, message):
    from tritond.options import UsageError
    with pytest.raises(UsageError, match=message):
        options(*flags)


@pytest.mark.parametrize("flags, message", [
    (["--load-model=a"], "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
    (["--model-control-mode=explicit", "--load-model=*", "--load-model=a"],
     "Wildcard model name '*' must be the ONLY startup model if specified at all."),
])
def test_startup_model_flags_are_refused_in_tritonservers_words(flags, message):
    """Triton's OpenAI tests match these messages of tritonserver exactly."""
    from tritond.options import UsageError
    with pytest.raises(UsageError) as e:
        options(*flags)
    assert str(e.value) == message


@pytest.mark.parametrize("flags, message", [
    (["--model-control-mode=paged"], "needs --model-memory-budget=BYTES"),
    (["--model-control-mode=paged", "--model-memory-budget=0"], "needs --model-memory-budget=BYTES"),
    (["--model-memory-budget=1000"], "--model-memory-budget needs --model-control-mode=paged"),
    (["--model-control-mode=poll", "--model-memory-budget=1000"], "needs --model-control-mode=paged"),
    (["--model-control-mode=paged", "--model-memory-budget=1000", "--load-model=*"], "leaves nothing to page"),
    (["--model-control-mode=paged", "--model-memory-budget=1000", "--broker-shards=2"], "--broker-shards=1"),
    (["--model-control-mode=paged", "--model-memory-budget=1000", "--rate-limit=execution_count"],
     "--rate-limit=execution_count"),
    (["--model-gpu-memory-budget=0:1000"], "--model-gpu-memory-budget needs --model-control-mode=paged"),
    (["--model-control-mode=paged", "--model-memory-budget=1000", "--model-gpu-memory-budget=0"],
     "must be <GPU id>:<bytes>"),
    (["--model-control-mode=paged", "--model-memory-budget=1000", "--model-gpu-memory-budget=0:0"],
     "must be <GPU id>:<bytes>"),
    (["--model-control-mode=paged", "--model-memory-budget=1000", "--model-gpu-memory-budget=0:5",
      "--model-gpu-memory-budget=0:6"], "names GPU 0 twice"),
])
def test_paging_is_refused_where_it_cannot_keep_its_budget(flags, message):
    import re
    from tritond.options import UsageError
    with pytest.raises(UsageError, match=re.escape(message)):
        options(*flags)
