"""The server options: what `tritond start`'s command line means, as one typed Struct.

tritond/options.py builds and checks it once at startup; the supervisor adds what it knows at
run time (the server id, the run directory, its pid, ...) and passes it to every process as
JSON on the command line, where `decode` reads it once. Each key is a field here, with its type
and its one default (the meaning when the flag is not given), so no reader repeats a default
and a key is never agreed by its spelling alone. An unknown key or a wrong type is refused
when decoded, naming the key.
"""
from __future__ import annotations

from typing import Literal

import msgspec

from .schema import LogConfig


# Triton's --metrics-config summary_quantiles: (quantile, error) pairs
DEFAULT_BACKEND_DIRECTORY = "/opt/tritonserver/backends"     # Triton's; read for Python-based backends only
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))


class _O(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class TlsConfig(_O):
    """One port's TLS settings (--<proto>-use-ssl[-mutual], --<proto>-server-cert, ...)."""
    cert: str
    key: str
    root: str | None = None          # root certificates that client certificates must chain to
    mutual: bool = False             # require and verify a client certificate


class MetricsConfig(_O):
    """`--metrics-config <setting>=<value>` and `--metrics-interval-ms`."""
    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: list[tuple[float, float]] = msgspec.field(default_factory=lambda: list(DEFAULT_QUANTILES))
    interval_ms: float = 2000.0


class OtelConfig(_O):
    """`--trace-config opentelemetry,<setting>=<value>`."""
    url: str = "http://localhost:4318/v1/traces"
    resource: dict[str, str] = {}
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000
    bsp_max_export_batch_size: int = 512


class TraceConfig(_O):
    """`--trace-config [<mode>,]<setting>=<value>`, Triton's keys and defaults."""
    level: Literal["OFF", "TIMESTAMPS"] = "OFF"
    tensors: bool = False            # level TENSORS too: traces hold the input and output tensors
    rate: int = 1000
    count: int = -1                  # -1: no limit
    mode: Literal["triton", "opentelemetry"] = "triton"
    file: str = ""
    log_frequency: int = 0
    otel: OtelConfig = OtelConfig()


class HttpLimitsConfig(_O):
    """What one HTTP client connection may hold (tritond/connection_limits.py's flags)."""
    max_header_size: int = 64 * 1024
    max_headers: int = 100
    header_timeout_secs: float = 10.0
    body_timeout_secs: float = 60.0
    keepalive_timeout_secs: float = 5.0
    max_connections: int = 1024


class OpenAIConfig(_O):
    """The OpenAI-compatible frontend (`--openai-port` and the flags beside it)."""
    address: str
    port: int
    tokenizer: str = ""              # a local tokenizer directory: chat template and token counts
    chat_template: str = ""          # a Jinja chat template file that replaces the tokenizer's
    default_max_tokens: int = 16
    tool_call_parser: str = ""       # llama3 | mistral: the format of the tool calls in answers ("": none)
    restricted: dict[str, tuple[str, str]] = {}     # API -> (header, value)
    tls: TlsConfig | None = None     # HTTP's TLS settings, when HTTP serves TLS


class ServerOptions(_O):
    """Every process's view of the command line; see `tritond start --help` for each flag."""
    model_repositories: list[str]
    server_name: str = "triton"
    # ports
    http_address: str = "127.0.0.1"
    http_port: int = 8000
    grpc_address: str = "127.0.0.1"
    grpc_port: int = 8001
    metrics_address: str = ""        # the command line fills in the HTTP address when not given
    metrics_port: int = 8002         # 0: no metrics port (every HTTP frontend process but the first)
    allow_http: bool = True
    allow_grpc: bool = True
    http_server: Literal["uvicorn", "hypercorn"] = "uvicorn"
    http_workers: int = 1
    grpc_workers: int = 1
    broker_shards: int = 1           # broker processes, each scheduling its own group of models
    shard: int = 0                   # this broker's index among them (0: the primary, which starts the others)
    http_max_input_size: int = 1 << 26
    # access: {category: (header, value)} and {category: [RFC 4514 name, ...]}
    http_restricted: dict[str, tuple[str, str]] = {}
    grpc_restricted: dict[str, tuple[str, str]] = {}
    http_restricted_subjects: dict[str, list[str]] = {}
    grpc_restricted_subjects: dict[str, list[str]] = {}
    # headers forwarded to models as request parameters (None: none)
    http_header_forward: str | None = None
    grpc_header_forward: str | None = None
    http_tls: TlsConfig | None = None
    openai: OpenAIConfig | None = None       # None: no OpenAI-compatible frontend
    grpc_tls: TlsConfig | None = None
    metrics_tls: TlsConfig | None = None
    # connection limits; gRPC's as (channel argument, value)
    http_limits: HttpLimitsConfig = HttpLimitsConfig()
    grpc_channel_args: list[tuple[str, int]] = []
    # lifecycle
    exit_timeout_secs: float = 30.0
    broker_hang_timeout_secs: float = 30.0
    exit_on_error: bool = True
    strict_readiness: bool = True
    allow_client_shm: bool = False
    model_control_mode: Literal["none", "poll", "explicit", "paged"] = "none"
    load_models: list[str] = []      # explicit mode: loaded at startup; paged mode: pinned
    model_memory_budget: int = 0     # paged mode: bytes of host memory the whole server may use
    model_gpu_memory_budget: dict[int, int] = msgspec.field(default_factory=dict)   # paged mode: GPU id -> bytes
    repository_poll_secs: int = 15
    model_load_thread_count: int = 4
    model_unload_timeout_secs: float = 30.0
    model_file_override_max_bytes: int = 256 << 20
    rate_limit: Literal["off", "execution_count"] = "off"
    rate_limit_resources: list[str] = []      # NAME:COUNT[:DEVICE]
    model_config_name: str = ""
    backend_directory: str = DEFAULT_BACKEND_DIRECTORY
    disable_auto_complete: bool = False
    default_max_batch_size: dict[str, int] = msgspec.field(default_factory=lambda: {"": 4})   # per backend ('': all)
    mps: bool = False
    mps_active_thread_percentage: int | None = None
    worker_templates: bool = True
    # observability
    log_verbose: int = 0
    log: LogConfig = LogConfig()
    metrics: MetricsConfig = MetricsConfig()
    trace: TraceConfig = TraceConfig()
    cache_size: int = 0              # the response cache's bytes (0: no cache)
    cpu_metrics: bool = True
    gpu_metrics: bool = True
    startup_notes: list[tuple[str, str]] = []    # (level, line) the supervisor logs about ignored flags
    # set at run time, not by a flag
    init_failed: str = ""            # why the repository is unusable (--exit-on-error=false): neither live nor ready
    server_id: str = ""
    run_dir: str = ""
    supervisor_pid: int = 0          # the parent: another broker has the first broker's pid here
    mps_env: dict[str, str] = {}     # what a GPU worker's environment needs under --mps
    ready_fd: int | None = None      # frontends: their end of the readiness socket pair


# Every field's default: the command line's flags take theirs from here.
DEFAULTS = ServerOptions(model_repositories=[])
_decoder = msgspec.json.Decoder(ServerOptions)


def encode(options: ServerOptions) -> str:
    """The options as one command-line argument."""
    return msgspec.json.encode(options).decode()


def decode(text: str | bytes) -> ServerOptions:
    """The options a process was started with; msgspec.ValidationError names a key that is
    unknown or has the wrong type."""
    return _decoder.decode(text)


def build(values: dict) -> ServerOptions:
    """The options from plain values (nested groups as dicts), checked as `decode` checks them."""
    return msgspec.convert(values, ServerOptions)
