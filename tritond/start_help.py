"""How `tritond start --help` is laid out: every flag in the group tritonserver's --help puts it
in (tritond's own flags beside the tritonserver flags they belong with), each with its default,
and how a mistyped flag is answered (one line naming the closest flag, not the usage)."""
from __future__ import annotations

import argparse
import difflib
from typing import Any

# tritonserver's --help groups in its order (src/command_line_parser.cc, SetupOptionGroups),
# with the flags tritond puts in each.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Server", ("--id", "--exit-timeout-secs", "--broker-hang-timeout-secs", "--broker-shards", "--worker-templates")),
    ("Logging", ("--log-verbose", "--log-info", "--log-warning", "--log-error", "--log-format", "--log-file")),
    ("Model Repository", (
        "--model-repository", "--exit-on-error", "--disable-auto-complete-config", "--strict-readiness",
        "--model-control-mode", "--repository-poll-secs", "--load-model", "--model-memory-budget",
        "--model-gpu-memory-budget",
        "--model-config-name",
        "--model-load-thread-count", "--model-load-retry-count", "--model-namespacing", "--enable-peer-access",
        "--model-unload-timeout-secs", "--model-file-override-max-bytes")),
    ("HTTP", (
        "--allow-http", "--http-address", "--http-port", "--reuse-http-port", "--http-header-forward-pattern",
        "--http-thread-count", "--http-max-input-size", "--http-restricted-api", "--http-server",
        "--http-workers", "--http-use-ssl", "--http-use-ssl-mutual", "--http-server-cert", "--http-server-key",
        "--http-root-cert", "--http-restricted-api-subject", "--http-max-header-size", "--http-max-headers",
        "--http-header-timeout-secs", "--http-body-timeout-secs", "--http-keepalive-timeout-secs",
        "--http-max-connections")),
    ("GRPC", (
        "--allow-grpc", "--grpc-address", "--grpc-port", "--reuse-grpc-port", "--grpc-header-forward-pattern",
        "--grpc-infer-thread-count", "--grpc-infer-allocation-pool-size", "--grpc-max-response-pool-size",
        "--grpc-use-ssl", "--grpc-use-ssl-mutual", "--grpc-server-cert", "--grpc-server-key", "--grpc-root-cert",
        "--grpc-infer-response-compression-level", "--grpc-keepalive-time", "--grpc-keepalive-timeout",
        "--grpc-keepalive-permit-without-calls", "--grpc-http2-max-pings-without-data",
        "--grpc-http2-min-recv-ping-interval-without-data", "--grpc-http2-max-ping-strikes",
        "--grpc-max-connection-age", "--grpc-max-connection-age-grace", "--grpc-restricted-protocol",
        "--grpc-workers", "--grpc-restricted-protocol-subject", "--grpc-max-concurrent-streams")),
    ("OpenAI", ("--openai-port", "--openai-address", "--openai-restricted-api", "--tokenizer", "--chat-template",
                "--default-max-tokens", "--tool-call-parser")),
    ("Sagemaker", ("--allow-sagemaker", "--sagemaker-port", "--sagemaker-safe-port-range",
                   "--sagemaker-thread-count")),
    ("Vertex", ("--allow-vertex-ai", "--vertex-ai-port", "--vertex-ai-thread-count", "--vertex-ai-default-model")),
    ("Metrics", ("--allow-metrics", "--allow-gpu-metrics", "--allow-cpu-metrics", "--metrics-address",
                 "--metrics-port", "--metrics-interval-ms", "--metrics-config", "--metrics-use-ssl")),
    ("Tracing", ("--trace-config",)),
    ("Backend", ("--backend-directory", "--backend-config")),
    ("Repository Agent", ("--repoagent-directory",)),
    ("Response Cache", ("--cache-config", "--cache-directory")),
    ("Rate Limiter", ("--rate-limit", "--rate-limit-resource")),
    ("Memory/Device Management", (
        "--pinned-memory-pool-byte-size", "--cuda-memory-pool-byte-size", "--cuda-virtual-address-size",
        "--min-supported-compute-capability", "--buffer-manager-thread-count", "--host-policy",
        "--model-load-gpu-limit", "--mps", "--mps-active-thread-percentage")),
    ("Shared Memory", ("--allow-client-shm",)),
    ("DEPRECATED", ("--strict-model-config", "--response-cache-byte-size", "--trace-file", "--trace-level",
                    "--trace-rate", "--trace-count", "--trace-log-frequency")),
)


class Grouped:
    """Stands in for the parser while flags are added: each lands in its tritonserver group, and
    a flag with no group is an error at once (so --help can never leave one out)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser
        groups = {title: parser.add_argument_group(title) for title, _ in GROUPS}
        self._group_of = {flag: groups[title] for title, flags in GROUPS for flag in flags}

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        group = self._group_of.get(names[0])
        if group is None:
            raise KeyError(f"{names[0]} has no group in tritond/start_help.py")
        return group.add_argument(*names, **kwargs)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"'{value}'" if value == "" else str(value)


class HelpFormatter(argparse.HelpFormatter):
    """Appends each flag's default, in the command line's own spelling (true/false), unless the
    help says it already or there is none to give (repeatable flags, flags that are off unless
    given)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "(default" in text or default is None or default == [] or default is argparse.SUPPRESS:
            return text
        return f"{text} (default: {_shown(default).replace('%', '%%')})"


def unknown_option(prog: str, arg: str) -> str:
    """One line for a flag nobody has: the closest real one and where the list is."""
    name = arg.split("=", 1)[0]
    if not name.startswith("-"):
        return f"unexpected argument '{arg}' (run '{prog} --help' for the options)"
    flags = [flag for _, group in GROUPS for flag in group]
    close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unrecognized option '{name}'{hint} (run '{prog} --help' for the options)"
