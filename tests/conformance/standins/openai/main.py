"""Stand-in for Triton's `openai_frontend/main.py`: the same command line, served by tritond.

Triton's tests start `python3 openai_frontend/main.py <args>` and talk HTTP to port 9000; this
maps those args onto `tritond start` and execs it (so the tests' SIGTERM reaches tritond).
`--backend` and `--uvicorn-log-level` have no counterpart (tritond finds a model's interface
from its inputs), so they are accepted and dropped; LoRA is refused. `--enable-kserve-frontends`
keeps tritond's HTTP/gRPC on the given ports; without it they are off, as in Triton's frontend.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

DEFAULT_MAX_TOOL_CALL_PARSE_BYTES = 128 * 1024      # Triton's default


def parse(argv: list[str]) -> argparse.Namespace:
    """Triton's frontend flags, with its defaults."""
    p = argparse.ArgumentParser(description="Triton's OpenAI frontend command line, served by tritond")
    p.add_argument("--model-repository", required=True)
    p.add_argument("--tokenizer")
    p.add_argument("--backend", choices=["vllm", "tensorrtllm"])
    p.add_argument("--lora-separator")
    p.add_argument("--tritonserver-log-verbose-level", type=int, default=0)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--tool-call-parser")
    p.add_argument("--max-tool-call-parse-bytes", type=int, default=DEFAULT_MAX_TOOL_CALL_PARSE_BYTES)
    p.add_argument("--chat-template")
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--model-control-mode", default="none", choices=["none", "explicit"])
    p.add_argument("--load-model", action="append", default=None)
    p.add_argument("--openai-port", type=int, default=9000)
    p.add_argument("--uvicorn-log-level", default="info")
    p.add_argument("--openai-restricted-api", nargs=3, action="append", default=None)
    p.add_argument("--http-max-input-size")
    p.add_argument("--enable-kserve-frontends", action="store_true")
    p.add_argument("--kserve-http-port", type=int, default=8000)
    p.add_argument("--kserve-grpc-port", type=int, default=8001)
    return p.parse_args(argv)


def tritond_args(a: argparse.Namespace) -> list[str]:
    """The `tritond start` arguments for Triton's frontend flags."""
    if a.lora_separator is not None:
        sys.exit("main.py (tritond stand-in): --lora-separator: tritond serves no LoRA adapters")
    if a.max_tool_call_parse_bytes != DEFAULT_MAX_TOOL_CALL_PARSE_BYTES:
        sys.exit("main.py (tritond stand-in): --max-tool-call-parse-bytes has no tritond counterpart")
    args = ["start", "--model-repository", a.model_repository, "--model-control-mode", a.model_control_mode,
            "--openai-port", str(a.openai_port), "--openai-address", a.host,
            "--default-max-tokens", str(a.default_max_tokens)]
    if a.tritonserver_log_verbose_level:
        args += ["--log-verbose", str(a.tritonserver_log_verbose_level)]
    for name in a.load_model or ():
        args.append(f"--load-model={name}")
    for flag, value in (("--tokenizer", a.tokenizer), ("--tool-call-parser", a.tool_call_parser),
                        ("--chat-template", a.chat_template), ("--http-max-input-size", a.http_max_input_size)):
        if value is not None:
            args += [flag, value]
    for apis, key, value in a.openai_restricted_api or ():
        args += ["--openai-restricted-api", apis, key, value]
    if a.enable_kserve_frontends:
        args += ["--http-port", str(a.kserve_http_port), "--grpc-port", str(a.kserve_grpc_port)]
    else:
        args += ["--allow-http=false", "--allow-grpc=false"]
    return args


def main() -> None:
    tritond = os.environ.get("TRITOND") or shutil.which("tritond")
    if tritond is None:
        sys.exit("main.py (tritond stand-in): no tritond (set TRITOND or put it on PATH)")
    os.execv(tritond, [tritond, *tritond_args(parse(sys.argv[1:]))])


if __name__ == "__main__":
    main()
