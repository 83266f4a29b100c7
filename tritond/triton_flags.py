"""tritonserver's flags that tritond does not implement, and what it does with each.

A tritonserver command line must keep working with only the program name changed, so every
flag of tritonserver is recognised. The ones below are not implemented: one that would change
what the server does (its answers, what it loads, where its output goes) stops startup with
exit 1; one that only tunes performance or what is observed, so that ignoring it changes no
answer, is ignored with a warning. A value that asks for nothing beyond what tritond does
(`--model-namespacing=false`, `--allow-sagemaker=false`) is accepted silently either way.

This is data: when a flag is implemented, its entry leaves the table (and the flag joins the
parser in options.py).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

REFUSE = "refuse"
WARN = "warn"

FALSE = ("false", "0", "off")
TRUE = ("true", "1", "on")


@dataclass(frozen=True)
class Flag:
    decision: str
    why: str = ""
    harmless: tuple[str, ...] = ()    # values (lower case) that ask for nothing tritond lacks


FLAGS: dict[str, Flag] = {
    # ---------------------------------------------------------------- features not implemented yet
    "--model-load-retry-count": Flag(REFUSE, "retrying failed loads", ("0",)),
    "--model-namespacing": Flag(REFUSE, "model namespacing", FALSE),
    "--model-load-gpu-limit": Flag(REFUSE, "GPU memory limits on loading"),
    "--host-policy": Flag(REFUSE, "host policies"),
    "--allow-sagemaker": Flag(REFUSE, "the SageMaker endpoint", FALSE),
    "--sagemaker-port": Flag(REFUSE, "the SageMaker endpoint"),
    "--sagemaker-safe-port-range": Flag(REFUSE, "the SageMaker endpoint"),
    "--sagemaker-thread-count": Flag(REFUSE, "the SageMaker endpoint"),
    "--allow-vertex-ai": Flag(REFUSE, "the Vertex AI endpoint", FALSE),
    "--vertex-ai-port": Flag(REFUSE, "the Vertex AI endpoint"),
    "--vertex-ai-thread-count": Flag(REFUSE, "the Vertex AI endpoint"),
    "--vertex-ai-default-model": Flag(REFUSE, "the Vertex AI endpoint"),
    # ---------------------------------------------------------------- tuning and observability: ignored
    "--http-thread-count": Flag(WARN, "HTTP concurrency is --http-workers processes"),
    "--grpc-infer-thread-count": Flag(WARN, "gRPC concurrency is --grpc-workers processes"),
    "--grpc-infer-allocation-pool-size": Flag(WARN, "tritond pools no request objects"),
    "--grpc-max-response-pool-size": Flag(WARN, "tritond pools no response objects"),
    "--grpc-infer-response-compression-level": Flag(WARN, "responses are not compressed", ("none",)),
    "--reuse-http-port": Flag(WARN, "HTTP frontend processes always share the port", TRUE),
    "--reuse-grpc-port": Flag(WARN, "gRPC frontend processes always share the port", TRUE),
    "--pinned-memory-pool-byte-size": Flag(WARN, "tritond has no pinned-memory pool"),
    "--cuda-memory-pool-byte-size": Flag(WARN, "tritond has no CUDA memory pool"),
    "--cuda-virtual-address-size": Flag(WARN, "tritond has no CUDA memory pool"),
    "--buffer-manager-thread-count": Flag(WARN, "tritond has no buffer-manager threads"),
    "--min-supported-compute-capability": Flag(WARN, "GPUs are not filtered by compute capability"),
    "--enable-peer-access": Flag(WARN, "peer access is left as CUDA sets it"),
    "--cache-directory": Flag(WARN, "tritond loads no cache plugins"),
    "--repoagent-directory": Flag(WARN, "tritond loads no repository agents"),
}


def add_to(parser: Any) -> None:
    """Recognise every flag of the table; --help says what tritond does with each."""
    for name, flag in FLAGS.items():
        parser.add_argument(name, dest=dest(name), action="append", nargs="?", const="true",
                            default=None, metavar="VALUE", help=help_text(flag))


def help_text(flag: Flag) -> str:
    accepted = f"; accepted: {', '.join(flag.harmless)}" if flag.harmless else ""
    if flag.decision == REFUSE:
        return f"not supported: {flag.why}{accepted}"
    return f"ignored with a warning: {flag.why}"


def dest(name: str) -> str:
    return "triton_" + name.lstrip("-").replace("-", "_")


def check(args: argparse.Namespace) -> tuple[list[str], list[tuple[str, str]]]:
    """(refusals, notes) for the table's flags given on the command line; a note is
    (log level name, line)."""
    refused: list[str] = []
    notes: list[tuple[str, str]] = []
    for name, flag in FLAGS.items():
        values = getattr(args, dest(name), None)
        if values is None:
            continue
        if all(v.strip().lower() in flag.harmless for v in values):
            continue
        elif flag.decision == REFUSE:
            refused.append(f"'{name}' is a tritonserver flag that tritond does not support yet ({flag.why})")
        else:
            notes.append(("WARNING", f"'{name}' is a tritonserver flag that tritond ignores: {flag.why}"))
    return refused, notes
