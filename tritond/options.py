"""Command-line options, spelled as tritonserver spells them where the meaning is the same."""
from __future__ import annotations

import argparse
import os
from typing import Any

from tritond.broker.scheduling.rate_limiter import parse_resources
from tritond.frontend.header_forward import PatternError, compile_pattern
from tritond.repository.remote import RemoteError, check_available
from tritond.wire import options as wire_options
from tritond.wire.options import DEFAULTS as _D, ServerOptions

from . import connection_limits, observe_options, start_help, triton_flags


class UsageError(Exception):
    """A command line tritond refuses; printed as `tritond start: error: <message>`, or as is when
    the message is tritonserver's own line (it starts with "Error: ", which scripts grep for)."""


def parse_bool(value: str) -> bool:
    v = str(value).strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value '{value}' (use true/false/1/0)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit code 1 like tritonserver, not argparse's 2
        raise UsageError(message)

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """A stray argument is named in one line with the closest flag; --model-repository is
        checked after that, so a mistyped flag is what the user is told about first."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            raise UsageError(start_help.unknown_option(self.prog, extras[0]))
        if not parsed.model_repositories:
            raise UsageError("--model-repository is required (a model repository directory or URL)")
        return parsed


def _flag(p: Any, name: str, default: bool, help_text: str) -> None:
    p.add_argument(name, type=parse_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help_text)


def start_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tritond start", usage="tritond start --model-repository DIR [options]",
                     description="Serve a Triton model repository. Flags are tritonserver's unless marked as "
                                 "tritond's; booleans take --flag=true|false|1|0.",
                     formatter_class=start_help.HelpFormatter)
    p = start_help.Grouped(parser)
    p.add_argument("--model-repository", "--model-store", dest="model_repositories", action="append",
                   metavar="DIR", help="model repository: a directory, or an s3://, gs:// or as:// URL (repeatable)")
    p.add_argument("--id", dest="server_name", default=_D.server_name, metavar="NAME",
                   help="server name in server metadata")
    p.add_argument("--http-address", default=_D.http_address, metavar="ADDR", help="address HTTP binds to")
    p.add_argument("--http-port", type=int, default=_D.http_port, metavar="PORT", help="HTTP port")
    p.add_argument("--grpc-address", default=_D.grpc_address, metavar="ADDR", help="address gRPC binds to")
    p.add_argument("--grpc-port", type=int, default=_D.grpc_port, metavar="PORT", help="gRPC port")
    p.add_argument("--metrics-address", default=_D.metrics_address, metavar="ADDR",
                   help="address metrics bind to ('': the HTTP address)")
    p.add_argument("--metrics-port", type=int, default=_D.metrics_port, metavar="PORT", help="metrics port")
    _flag(p, "--allow-http", _D.allow_http, "serve HTTP")
    _flag(p, "--allow-grpc", _D.allow_grpc, "serve gRPC")
    _flag(p, "--allow-metrics", True, "serve Prometheus metrics")
    p.add_argument("--http-server", choices=["uvicorn", "hypercorn"], default=_D.http_server,
                   help="tritond's: HTTP server, uvicorn+httptools (fast) or hypercorn (HTTP/2)")
    p.add_argument("--http-workers", type=int, default=_D.http_workers, metavar="N",
                   help="tritond's: HTTP frontend processes sharing the port")
    p.add_argument("--grpc-workers", type=int, default=_D.grpc_workers, metavar="N",
                   help="tritond's: gRPC frontend processes sharing the port")
    p.add_argument("--broker-shards", type=int, default=_D.broker_shards, metavar="N",
                   help="tritond's: broker processes, each scheduling its own group of models (an ensemble "
                        "with the models it composes); frontends route each request to its model's broker")
    p.add_argument("--http-max-input-size", type=int, default=_D.http_max_input_size, metavar="BYTES",
                   help="largest HTTP request body")
    p.add_argument("--http-restricted-api", action="append", default=[], metavar="CATEGORIES:KEY=VALUE",
                   help="serve these API categories only to requests with this header (repeatable)")
    p.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="CATEGORIES:KEY=VALUE",
                   help="serve these protocol categories only to calls with this metadata (repeatable)")
    for proto, name in (("http", "HTTP"), ("grpc", "gRPC")):
        p.add_argument(f"--{proto}-header-forward-pattern", metavar="REGEX",
                       help=f"forward the {name} request headers whose names match this (RE2, case-insensitive) "
                            f"pattern to models as request parameters")
    for proto, name in (("grpc", "gRPC"), ("http", "HTTP")):
        mine = "tritond's: " if proto == "http" else ""
        p.add_argument(f"--{proto}-use-ssl", type=parse_bool, nargs="?", const=True, default=None, metavar="BOOL",
                       help=f"{mine}serve {name} over TLS (default: false, true with --{proto}-use-ssl-mutual)")
        p.add_argument(f"--{proto}-use-ssl-mutual", type=parse_bool, nargs="?", const=True, default=None,
                       metavar="BOOL", help=f"{mine}serve {name} over TLS and require client certificates "
                                            f"(default: false)")
        p.add_argument(f"--{proto}-server-cert", metavar="PEM", help=f"{mine}server certificate (chain) file")
        p.add_argument(f"--{proto}-server-key", metavar="PEM", help=f"{mine}server private key file")
        p.add_argument(f"--{proto}-root-cert", metavar="PEM",
                       help=f"{mine}root certificates that client certificates must chain to")
    p.add_argument("--openai-port", type=int, default=0, metavar="PORT",
                   help="tritond's: serve the OpenAI-compatible API (/v1/models, /v1/completions, "
                        "/v1/chat/completions, /v1/embeddings) on this port (0: not served); over TLS when HTTP is")
    p.add_argument("--openai-address", metavar="ADDR", help="tritond's: address the OpenAI API binds to "
                                                             "(default: the HTTP address)")
    p.add_argument("--openai-restricted-api", nargs=3, action="append", default=[],
                   metavar=("APIS", "KEY", "VALUE"),
                   help="serve these OpenAI API groups (inference, model-repository, metrics, health; "
                        "comma-separated) only to requests with header KEY: VALUE (repeatable)")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="OpenAI API: a local tokenizer directory (tokenizer_config.json's chat_template, "
                        "tokenizer.json) for chat prompts and token counts; nothing is downloaded")
    p.add_argument("--chat-template", metavar="FILE", help="OpenAI API: a Jinja chat template that replaces "
                                                            "the tokenizer's")
    p.add_argument("--default-max-tokens", type=int, metavar="N",
                   help="OpenAI API: the max_tokens of a request that sets none (default: 16)")
    p.add_argument("--tool-call-parser", choices=["llama3", "mistral"],
                   help="OpenAI API: parse the tool calls of chat answers in this model family's format")
    _flag(p, "--metrics-use-ssl", False, "tritond's: serve metrics over TLS with the HTTP certificate settings")
    p.add_argument("--http-restricted-api-subject", action="append", default=[], metavar="CATEGORIES:NAME",
                   help="tritond's: limit API categories to clients whose certificate subject matches an "
                        "RFC 4514 name")
    p.add_argument("--grpc-restricted-protocol-subject", action="append", default=[], metavar="CATEGORIES:NAME",
                   help="tritond's: limit protocol categories to clients whose certificate subject matches an "
                        "RFC 4514 name")
    p.add_argument("--log-verbose", type=int, default=_D.log_verbose, metavar="LEVEL",
                   help="verbose logging at this level and below (0: off)")
    p.add_argument("--exit-timeout-secs", type=float, default=_D.exit_timeout_secs, metavar="SECS",
                   help="on SIGTERM/SIGINT, how long in-flight requests may finish before the server exits")
    p.add_argument("--broker-hang-timeout-secs", type=float, default=_D.broker_hang_timeout_secs, metavar="SECS",
                   help="tritond's: restart the broker when it has sent nothing for this long (it pings twice a "
                        "second)")
    _flag(p, "--exit-on-error", _D.exit_on_error, "exit when a model fails to load at startup")
    _flag(p, "--strict-readiness", _D.strict_readiness, "ready only when every model is ready")
    _flag(p, "--allow-client-shm", _D.allow_client_shm, "allow client shared-memory registration")
    p.add_argument("--model-control-mode", type=str.lower, choices=["none", "poll", "explicit", "paged"],
                   default=_D.model_control_mode,
                   help="none: load the repository at startup; poll: follow its changes; explicit: load and "
                        "unload through the repository API; paged (tritond's): load each model on its first "
                        "request and unload the least recently used ones to keep within --model-memory-budget")
    p.add_argument("--load-model", dest="load_models", action="append", default=[], metavar="NAME",
                   help="explicit mode: load this model at startup, '*' for all; paged mode: load it at "
                        "startup and never page it out (repeatable)")
    p.add_argument("--model-memory-budget", type=int, default=_D.model_memory_budget, metavar="BYTES",
                   help="tritond's, paged mode: host memory the whole server may use (its own processes, pinned "
                        "and resident models), measured as its processes' proportional set size")
    p.add_argument("--model-gpu-memory-budget", dest="model_gpu_memory_budgets", action="append", default=[],
                   metavar="GPU:BYTES",
                   help="tritond's, paged mode: device memory the server's processes may use on this GPU, measured "
                        "through NVML; models with instances on a GPU page only where it has one (repeatable)")
    p.add_argument("--repository-poll-secs", type=int, default=_D.repository_poll_secs, metavar="SECS",
                   help="poll mode: rescan the repository this often (0: only on SIGHUP)")
    p.add_argument("--model-load-thread-count", type=int, default=_D.model_load_thread_count, metavar="N",
                   help="models loading at once (their configs read on this many threads)")
    p.add_argument("--model-unload-timeout-secs", type=float, default=_D.model_unload_timeout_secs, metavar="SECS",
                   help="tritond's: how long an unloaded or replaced model version may finish its queued and "
                        "executing requests before they fail")
    p.add_argument("--model-file-override-max-bytes", type=int, default=_D.model_file_override_max_bytes,
                   metavar="BYTES",
                   help="tritond's: total size of the 'file:' overrides one load request may carry")
    p.add_argument("--rate-limit", choices=["off", "execution_count"], default=_D.rate_limit,
                   help="execution_count: instances run only while their rate_limiter resources are free")
    p.add_argument("--rate-limit-resource", dest="rate_limit_resources", action="append", default=[],
                   metavar="NAME:COUNT[:DEVICE]", help="how much of a rate limiter resource there is (repeatable)")
    p.add_argument("--model-config-name", default=None, metavar="NAME",
                   help="read configs/<NAME>.pbtxt instead of config.pbtxt where it exists")
    p.add_argument("--backend-directory", default=_D.backend_directory, metavar="DIR",
                   help="where Python-based backends are: a config naming backend B that tritond does not build "
                        "in runs on the Python backend with DIR/B/model.py (tritond's own backends are built in)")
    _flag(p, "--disable-auto-complete-config", _D.disable_auto_complete, "do not auto-complete model configs")
    p.add_argument("--strict-model-config", type=parse_bool, nargs="?", const=True, default=None,
                   metavar="BOOL", help="deprecated: true disables auto-complete (default: false)")
    p.add_argument("--backend-config", action="append", default=[], metavar="[BACKEND,]SETTING=VALUE",
                   help="default-max-batch-size=N (default 4), tensorflow,version=2, "
                        "tensorflow,allow-soft-placement=true (repeatable)")
    _flag(p, "--mps", _D.mps, "tritond's: run GPU workers under a private NVIDIA MPS daemon")
    p.add_argument("--mps-active-thread-percentage", type=int, default=_D.mps_active_thread_percentage, metavar="PCT",
                   help="tritond's: share of a GPU's SMs each GPU worker may use under --mps, 1-100 "
                        "(default: MPS's, all)")
    observe_options.add_flags(p, _flag)
    _flag(p, "--worker-templates", _D.worker_templates,
          "tritond's: fork CPU workers from one warm process per backend that imported the framework once")
    connection_limits.add_arguments(p, parse_bool)
    triton_flags.add_to(p)
    return parser


API_CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
                  "statistics", "trace", "logging")


def _categories(text: str, spec: str, feature: str = "api") -> list[str]:
    cats = [c.strip() for c in text.split(",")]
    for cat in cats:
        if cat not in API_CATEGORIES:
            raise UsageError(f"unknown restricted {feature} '{cat}' in '{spec}'; "
                             f"expected one of {', '.join(API_CATEGORIES)}")
    return cats


def _restrictions(specs: list[str], feature: str) -> dict[str, tuple[str, str]]:
    """'<cat,...>:<key>=<value>' -> {category: (key, value)}; a misspelt category is an error,
    not an API silently left open. `feature` ("api" for HTTP, "protocol" for gRPC) words the
    errors as tritonserver does."""
    out: dict[str, tuple[str, str]] = {}
    for spec in specs:
        cats, sep, kv = spec.partition(":")
        key, eq, value = kv.partition("=")
        if not sep or not eq or not key:
            raise UsageError(f"invalid restricted API specification '{spec}', expected <categories>:<key>=<value>")
        for cat in _categories(cats, spec, feature):
            if cat in out:
                raise UsageError(f"restricted {feature} '{cat}' can not be specified in multiple config groups")
            out[cat] = (key.lower(), value)
    return out


def _subject_restrictions(specs: list[str], flag: str) -> dict[str, list[str]]:
    """'<cat,...>:<RFC 4514 name>' -> {category: [name, ...]}; a category may be given again
    to admit another subject."""
    from tritond.frontend.client_subject import parse_name
    out: dict[str, list[str]] = {}
    for spec in specs:
        cats, sep, name = spec.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"invalid {flag} specification '{spec}', expected <categories>:<name> "
                             f"such as model-repository:CN=ops-admin")
        try:
            parse_name(name.strip())
        except ValueError as e:
            raise UsageError(f"{flag} '{spec}': {e}") from None
        for cat in _categories(cats, spec):
            out.setdefault(cat, []).append(name.strip())
    return out


def _tls(args: argparse.Namespace, proto: str) -> dict[str, Any] | None:
    """One protocol's TLS settings. As in tritonserver, giving --<proto>-use-ssl-mutual turns
    TLS on. Certificate flags without TLS are refused (unless TLS is explicitly off), so a
    mistyped command line never serves clear text where certificates were meant."""
    explicit = getattr(args, f"{proto}_use_ssl")
    mutual = getattr(args, f"{proto}_use_ssl_mutual")
    use_ssl = explicit if explicit is not None else mutual is not None
    if mutual and not use_ssl:
        raise UsageError(f"--{proto}-use-ssl-mutual=true contradicts --{proto}-use-ssl=false")
    files = {name: getattr(args, f"{proto}_{name.replace('-', '_')}")
             for name in ("server-cert", "server-key", "root-cert")}
    if not use_ssl:
        given = [f"--{proto}-{name}" for name, path in files.items() if path]
        if given and explicit is None:
            raise UsageError(f"{', '.join(given)} given without --{proto}-use-ssl=true; the port would serve "
                             f"clear text (add --{proto}-use-ssl=true, or drop the certificate flags)")
        return None
    needed = ["server-cert", "server-key"] + (["root-cert"] if mutual else [])
    missing = [f"--{proto}-{name}" for name in needed if not files[name]]
    if missing:
        raise UsageError(f"--{proto}-use-ssl{'-mutual' if mutual else ''} needs {', '.join(missing)}")
    root = files["root-cert"]
    return {"cert": os.path.abspath(files["server-cert"]), "key": os.path.abspath(files["server-key"]),
            "root": os.path.abspath(root) if root else None, "mutual": bool(mutual)}


def _metrics_tls(args: argparse.Namespace, http_tls: dict[str, Any] | None) -> dict[str, Any] | None:
    """Metrics are served by the first HTTP frontend, over TLS only when asked."""
    if not args.metrics_use_ssl or not args.allow_http or not args.allow_metrics:
        return None
    if http_tls is None:
        raise UsageError("--metrics-use-ssl uses the HTTP certificate settings: it needs --http-use-ssl=true "
                         "with --http-server-cert and --http-server-key")
    return http_tls


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The options every process reads, checked (types included) before anything starts. Its
    `startup_notes` are the lines the supervisor logs about flags it accepted but ignores."""
    refused, notes = triton_flags.check(args)
    if refused:
        raise UsageError("; ".join(refused))
    if args.http_max_input_size <= 0:
        raise UsageError("Error: --http-max-input-size must be greater than 0.")
    if args.model_config_name == "":        # given, empty (not given is None)
        raise UsageError("Error: empty argument for --model-config-name")
    for repo in args.model_repositories:
        if "://" in repo:
            try:
                check_available(repo)
            except RemoteError as e:
                raise UsageError(str(e)) from None
    _paging(args)
    if args.model_control_mode not in ("explicit", "paged") and args.load_models:
        # tritonserver's words (Triton's OpenAI tests match them)
        raise UsageError("Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well.")
    if "*" in args.load_models and len(args.load_models) > 1:
        raise UsageError("Wildcard model name '*' must be the ONLY startup model if specified at all.")
    default_mbs = _backend_config(args.backend_config)
    _model_loading(args)
    disable_ac = args.disable_auto_complete_config or bool(args.strict_model_config)
    if args.strict_model_config is not None:        # tritonserver's words, which scripts grep for
        notes.append(("WARNING", "Warning: '--strict-model-config' has been deprecated! Please use "
                                 "'--disable-auto-complete-config' instead."))
        if args.disable_auto_complete_config and not args.strict_model_config:
            notes.append(("WARNING", "Warning: Overriding deprecated '--strict-model-config' from False to True in "
                                     "favor of '--disable-auto-complete-config'!"))
    old_trace, trace_warnings = observe_options.deprecated_trace_entries(args)
    notes += [("WARNING", line) for line in trace_warnings]
    try:
        observe = {"log": observe_options.log_settings(args),
                   "metrics": observe_options.metrics_settings(args.metrics_config, args.metrics_interval_ms),
                   "trace": observe_options.trace_settings([*old_trace, *args.trace_config]),
                   "cache_size": observe_options.cache_settings(args.cache_config, args.response_cache_byte_size),
                   "cpu_metrics": args.allow_cpu_metrics, "gpu_metrics": args.allow_gpu_metrics}
    except observe_options.FlagError as e:
        raise UsageError(str(e)) from None
    http_tls = _tls(args, "http")
    grpc_tls = _tls(args, "grpc")
    http_subjects = _subject_restrictions(args.http_restricted_api_subject, "--http-restricted-api-subject")
    grpc_subjects = _subject_restrictions(args.grpc_restricted_protocol_subject, "--grpc-restricted-protocol-subject")
    if http_subjects and not (http_tls and http_tls["mutual"]):
        raise UsageError("--http-restricted-api-subject needs --http-use-ssl-mutual=true (client certificates)")
    if grpc_subjects and not (grpc_tls and grpc_tls["mutual"]):
        raise UsageError("--grpc-restricted-protocol-subject needs --grpc-use-ssl-mutual=true (client certificates)")
    if http_subjects and args.http_server != "uvicorn":
        raise UsageError("--http-restricted-api-subject works with --http-server=uvicorn only: hypercorn does not "
                         "tell the application which certificate a connection presented")
    return wire_options.build({
        "model_repositories": [str(p) for p in args.model_repositories],
        "server_name": args.server_name,
        "http_address": args.http_address,
        "http_port": args.http_port,
        "grpc_address": args.grpc_address,
        "grpc_port": args.grpc_port,
        "metrics_address": args.metrics_address or args.http_address,
        "metrics_port": args.metrics_port if args.allow_metrics else 0,
        "allow_http": args.allow_http,
        "allow_grpc": args.allow_grpc,
        "http_server": args.http_server,
        "http_workers": max(1, args.http_workers),
        "grpc_workers": max(1, args.grpc_workers),
        "broker_shards": _broker_shards(args),
        "http_max_input_size": args.http_max_input_size,
        "http_restricted": _restrictions(args.http_restricted_api, "api"),
        "grpc_restricted": _restrictions(args.grpc_restricted_protocol, "protocol"),
        "http_restricted_subjects": http_subjects,
        "grpc_restricted_subjects": grpc_subjects,
        "http_header_forward": _forward_pattern(args.http_header_forward_pattern, "--http-header-forward-pattern"),
        "grpc_header_forward": _forward_pattern(args.grpc_header_forward_pattern, "--grpc-header-forward-pattern"),
        "http_tls": http_tls if args.allow_http else None,
        "openai": _openai(args, http_tls),
        "grpc_tls": grpc_tls if args.allow_grpc else None,
        "metrics_tls": _metrics_tls(args, http_tls),
        "log_verbose": args.log_verbose,
        "exit_timeout_secs": args.exit_timeout_secs,
        "broker_hang_timeout_secs": _positive(args.broker_hang_timeout_secs, "--broker-hang-timeout-secs"),
        "exit_on_error": args.exit_on_error,
        "strict_readiness": args.strict_readiness,
        "allow_client_shm": args.allow_client_shm,
        "model_control_mode": args.model_control_mode,
        "load_models": args.load_models,
        "model_memory_budget": args.model_memory_budget,
        "model_gpu_memory_budget": _gpu_budgets(args),
        "repository_poll_secs": args.repository_poll_secs,
        "model_load_thread_count": args.model_load_thread_count,
        "model_unload_timeout_secs": args.model_unload_timeout_secs,
        "model_file_override_max_bytes": args.model_file_override_max_bytes,
        "rate_limit": args.rate_limit,
        "rate_limit_resources": args.rate_limit_resources,
        "model_config_name": args.model_config_name or _D.model_config_name,
        "backend_directory": args.backend_directory,
        "disable_auto_complete": disable_ac,
        "default_max_batch_size": default_mbs,
        "mps": args.mps,
        "mps_active_thread_percentage": _percentage(args.mps_active_thread_percentage),
        **observe,
        **_connection_limits(args),
        "startup_notes": notes,
        "worker_templates": args.worker_templates,
    })


MAX_BROKER_SHARDS = 64
OPENAI_APIS = ("inference", "model-repository", "metrics", "health")


def _openai(args: argparse.Namespace, http_tls: dict[str, Any] | None) -> dict[str, Any] | None:
    """The OpenAI frontend's settings (None: not served). Its tokenizer directory and chat
    template are loaded here once, so a bad one stops startup with the file named."""
    given = [flag for flag, value in (("--tokenizer", args.tokenizer), ("--chat-template", args.chat_template),
                                      ("--openai-address", args.openai_address),
                                      ("--tool-call-parser", args.tool_call_parser),
                                      ("--openai-restricted-api", args.openai_restricted_api),
                                      ("--default-max-tokens", args.default_max_tokens is not None)) if value]
    if not args.openai_port:
        if given:
            raise UsageError(f"{', '.join(given)} need --openai-port")
        return None
    if not 0 < args.openai_port < 65536:
        raise UsageError(f"--openai-port must be from 1 to 65535, got {args.openai_port}")
    clash = [flag for flag, port in _served_ports(args).items() if port == args.openai_port]
    if clash:
        raise UsageError(f"--openai-port {args.openai_port} is also {clash[0]}")
    max_tokens = 16 if args.default_max_tokens is None else args.default_max_tokens
    if max_tokens < 1:
        raise UsageError(f"--default-max-tokens must be at least 1, got {max_tokens}")
    restricted: dict[str, tuple[str, str]] = {}
    for apis, key, value in args.openai_restricted_api:
        for api in apis.split(","):
            if api not in OPENAI_APIS:
                raise UsageError(f"--openai-restricted-api: Unknown API '{api}'. Available APIs: "   # Triton's words
                                 f"{list(OPENAI_APIS)}")
            if api in restricted:
                raise UsageError(f"restricted api '{api}' can not be specified in multiple config groups")
            restricted[api] = (key.lower(), value)
    tokenizer = os.path.abspath(args.tokenizer) if args.tokenizer else ""
    template = os.path.abspath(args.chat_template) if args.chat_template else ""
    if tokenizer or template:
        from tritond.frontend.openai.tokenizer import Tokenizer, TokenizerError
        try:
            Tokenizer(tokenizer, template)
        except TokenizerError as e:
            raise UsageError(str(e)) from None
    return {"address": args.openai_address or args.http_address, "port": args.openai_port,
            "tokenizer": tokenizer, "chat_template": template, "default_max_tokens": max_tokens,
            "restricted": restricted, "tls": http_tls, "tool_call_parser": args.tool_call_parser or ""}


def _served_ports(args: argparse.Namespace) -> dict[str, int]:
    """The ports the other frontends listen on: one that is off takes none (metrics are
    served by the HTTP frontend)."""
    served = {"--http-port": args.http_port if args.allow_http else 0,
              "--grpc-port": args.grpc_port if args.allow_grpc else 0,
              "--metrics-port": args.metrics_port if args.allow_http and args.allow_metrics else 0}
    return {flag: port for flag, port in served.items() if port}


def _forward_pattern(pattern: str | None, flag: str) -> str | None:
    if pattern is not None:
        try:
            compile_pattern(pattern)
        except PatternError as e:
            raise UsageError(f"{flag}: {e}") from None
    return pattern


def _broker_shards(args: argparse.Namespace) -> int:
    """More than one broker splits the models among them; what needs one view of every model
    is refused rather than split silently."""
    n = args.broker_shards
    if not 1 <= n <= MAX_BROKER_SHARDS:
        raise UsageError(f"--broker-shards must be between 1 and {MAX_BROKER_SHARDS}, got {n}")
    if n > 1 and args.rate_limit != "off":
        raise UsageError("--rate-limit=execution_count needs --broker-shards=1: its resources are shared by "
                         "every model, and each broker would count them alone")
    return n


def _connection_limits(args: argparse.Namespace) -> dict[str, Any]:
    try:
        return connection_limits.options(args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _paging(args: argparse.Namespace) -> None:
    """Paged mode and its budget go together; what paging cannot honour yet is refused."""
    if args.model_control_mode != "paged":
        if args.model_memory_budget:
            raise UsageError("--model-memory-budget needs --model-control-mode=paged")
        return
    if args.model_memory_budget <= 0:
        raise UsageError("--model-control-mode=paged needs --model-memory-budget=BYTES (greater than 0): the host "
                         "memory the whole server may use")
    if "*" in args.load_models:
        raise UsageError("--load-model=* pins every model, which leaves nothing to page; use "
                         "--model-control-mode=none to load them all")
    if args.broker_shards > 1:
        raise UsageError("--model-control-mode=paged needs --broker-shards=1: one broker keeps the budget for "
                         "every model")
    if args.rate_limit != "off":
        raise UsageError("--model-control-mode=paged does not work with --rate-limit=execution_count yet")


def _gpu_budgets(args: argparse.Namespace) -> dict[int, int]:
    """--model-gpu-memory-budget GPU:BYTES, each GPU once, in paged mode only."""
    out: dict[int, int] = {}
    for text in args.model_gpu_memory_budgets:
        gpu, sep, size = text.partition(":")
        if not sep or not gpu.strip().isdigit() or not size.strip().isdigit() or int(size) <= 0:
            raise UsageError(f"--model-gpu-memory-budget must be <GPU id>:<bytes> with bytes greater than 0, "
                             f"got '{text}'")
        if int(gpu) in out:
            raise UsageError(f"--model-gpu-memory-budget names GPU {int(gpu)} twice")
        out[int(gpu)] = int(size)
    if out and args.model_control_mode != "paged":
        raise UsageError("--model-gpu-memory-budget needs --model-control-mode=paged")
    return out


def _model_loading(args: argparse.Namespace) -> None:
    """The model lifecycle flags, checked before anything starts."""
    if args.repository_poll_secs < 0:
        raise UsageError(f"--repository-poll-secs must not be negative, got {args.repository_poll_secs}")
    if args.model_load_thread_count < 1:
        raise UsageError(f"--model-load-thread-count must be at least 1, got {args.model_load_thread_count}")
    _positive(args.model_unload_timeout_secs, "--model-unload-timeout-secs")
    _positive(args.model_file_override_max_bytes, "--model-file-override-max-bytes")
    try:
        parse_resources(args.rate_limit_resources)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _backend_config(entries: list[str]) -> dict[str, int]:
    """`--backend-config [<backend>,]<key>=<value>` -> default-max-batch-size per backend ('' for all).

    For the backends added with their whole settings (openvino, tensorflow) a setting tritond
    does not apply is refused rather than ignored."""
    defaults = {"": 4}
    form = "--backend-config option format is '<backend name>,<setting>=<value>'. Got "   # tritonserver's words
    for entry in entries:
        backend, sep, setting = entry.partition(",")
        if not sep:
            backend, setting = "", entry
        elif not backend:
            raise UsageError("No backend specified. --backend-config option format is <backend name>,<setting>=<value> "
                             f"or <setting>=<value>. Got {entry}")
        key, eq, value = setting.partition("=")
        if not eq or not key or not value:
            raise UsageError(form + entry)
        if key == "default-max-batch-size":
            if not value.strip().isdigit():
                raise UsageError(f"--backend-config '{entry}': default-max-batch-size must be a non-negative integer")
            defaults[backend] = int(value)
        elif backend == "tensorflow" and (key, value.strip()) == ("version", "2"):
            continue
        elif backend == "tensorflow" and key == "allow-soft-placement" and _is_true(value):
            continue   # TensorFlow 2 places ops softly already
        elif backend in ("tensorflow", "openvino"):
            raise UsageError(f"--backend-config '{entry}' is not supported by tritond")
    return defaults


def _is_true(value: str) -> bool:
    try:
        return parse_bool(value)
    except argparse.ArgumentTypeError:
        return False


def _percentage(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 100:
        raise UsageError(f"--mps-active-thread-percentage must be from 1 to 100, got {value}")
    return value


def _positive(value: float, flag: str) -> float:
    if not value > 0:
        raise UsageError(f"{flag} must be positive, got {value:g}")
    return value
