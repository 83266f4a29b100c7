#!/usr/bin/env python3
"""OpenAI frontend benchmark: streaming chat completions against the same model behind
generate_stream, on one tritond, in the same run.

The example `tiny_llm` (Triton's vLLM-backend interface, no pacing) answers each request with
`--tokens` words, one response each. Each client keeps one keep-alive connection and sends the
next request when the last one's stream ended (closed loop), at each concurrency level:
  chat   POST /v1/chat/completions {"stream": true} on the OpenAI port (chat template rendered,
         an OpenAI chunk per token, `data: [DONE]`);
  gen    POST /v2/models/tiny_llm/generate_stream on the HTTP port, the same prompt and
         settings as the model inputs the OpenAI frontend sends;
  triton the same generate_stream on real Triton (its Python backend), when a bench-anchors
         folder is prepared (perf/anchors.py).
Reported per case: tokens/s over all clients, the median time to the first token and the
median gap between tokens; the ratio to gen is the OpenAI layer's cost (chat) and Triton's
standing (triton). Cases take turns within each round; figures are medians over rounds.

  python perf/bench_openai.py [--rounds 3 --duration 4 --tokens 64 --concurrency 1,16,64]
                              [--anchors-dir /tmp/anchors]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path

from anchors import Triton, anchors_ready
from bench_core import READY_TIMEOUT_S, Server, build_repository, free_port

from tritond.perf.sse import closed_loop

READ_TIMEOUT_S = 30.0
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@dataclass
class Tally:
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    errors: int = 0


def chat_request(host: str, i: int, tokens: int) -> bytes:
    body = json.dumps({"model": "tiny_llm", "messages": [{"role": "user", "content": f"prompt number {i}"}],
                       "max_tokens": tokens, "temperature": 0, "stream": True}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def generate_request(host: str, i: int, tokens: int) -> bytes:
    prompt = f"<|user|> prompt number {i} <|assistant|>"
    body = json.dumps({"text_input": prompt, "stream": True, "exclude_input_in_output": True,
                       "sampling_parameters": json.dumps({"max_tokens": tokens, "temperature": 0})}).encode()
    return (f"POST /v2/models/tiny_llm/generate_stream HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def client(kind: str, port: int, tokens: int, until: float, start: float, out: Tally, seed: int) -> None:
    """One client on one keep-alive connection: a request, its event stream to the end, the next."""
    make = chat_request if kind == "chat" else generate_request      # gen and triton
    # token events: chat sends a first chunk with the role, then one per token, then [DONE]
    skip = 1 if kind == "chat" else 0
    loop = closed_loop("127.0.0.1", port, lambda i: make("127.0.0.1", i, tokens), seed, until, READ_TIMEOUT_S)
    try:
        async with aclosing(loop) as requests:
            async for _, last, events in requests:
                seen = 0
                async for now, count in events:
                    for _ in range(count):
                        if seen >= skip:
                            if now >= start:
                                out.tokens += 1
                                (out.ttft if seen == skip else out.gaps).append(now - last)
                            last = now
                        seen += 1
                if seen - skip != tokens:
                    out.errors += 1
    except (asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError, ConnectionError) as e:
        print(f"{kind} client: ended early ({type(e).__name__}: {e})", file=sys.stderr)
        out.errors += 1


async def run_case(kind: str, port: int, concurrency: int, tokens: int, warmup: float, duration: float
                   ) -> tuple[float, Tally]:
    out = Tally()
    start = time.perf_counter() + warmup
    until = start + duration
    await asyncio.gather(*(client(kind, port, tokens, until, start, out, 1000 * c) for c in range(concurrency)))
    return out.tokens / (time.perf_counter() - start), out


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--anchors-dir", type=Path, default=Path("/tmp/anchors"))
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo, ["tiny_llm"])
        tokenizer = Path(tmp) / "tokenizer"
        tokenizer.mkdir()
        (tokenizer / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
        openai_port = free_port()
        servers = [Server(repo, Path(tmp) / "tritond.log",
                          ["--openai-port", str(openai_port), "--tokenizer", str(tokenizer), "--allow-grpc=false"])]
        if anchors_ready(args.anchors_dir):
            triton_repo = Path(tmp) / "triton-models"
            build_repository(triton_repo, ["tiny_llm"])
            servers.append(Triton(args.anchors_dir, triton_repo, Path(tmp) / "triton.log"))
        else:
            print(f"no prepared bench-anchors folder at {args.anchors_dir}: Triton rows skipped", file=sys.stderr)
        try:
            for s in servers:
                s.wait_ready(READY_TIMEOUT_S)
            cases = [("chat", openai_port), ("gen", int(servers[0].http.rsplit(":", 1)[1]))]
            if len(servers) > 1:
                cases.append(("triton", int(servers[1].http.rsplit(":", 1)[1])))
            results: dict[tuple[str, int], list[tuple[float, Tally]]] = {}
            for _ in range(args.rounds):
                for c in levels:
                    for kind, port in cases:
                        results.setdefault((kind, c), []).append(
                            asyncio.run(run_case(kind, port, c, args.tokens, args.warmup, args.duration)))
        finally:
            for s in servers:
                s.stop()
    print(f"tiny_llm, {args.tokens} tokens per request, {args.rounds} rounds of {args.duration:g} s "
          f"(medians over rounds)")
    print(f"{'c':>4} {'case':<6} {'tokens/s':>10} {'TTFT ms':>9} {'gap ms':>8} {'errors':>7} {'/ gen':>7}")
    kinds = [k for k in ("chat", "gen", "triton") if (k, levels[0]) in results]
    for c in levels:
        rates = {k: statistics.median(r for r, _ in results[(k, c)]) for k in kinds}
        for kind in kinds:
            runs = results[(kind, c)]
            ttft = statistics.median(ms(t.ttft) for _, t in runs)
            gap = statistics.median(ms(t.gaps) for _, t in runs)
            errors = sum(t.errors for _, t in runs)
            ratio = f"{rates[kind] / rates['gen']:7.2f}" if kind != "gen" and rates["gen"] else ""
            print(f"{c:>4} {kind:<6} {rates[kind]:>10.0f} {ttft:>9.2f} {gap:>8.3f} {errors:>7} {ratio}")


if __name__ == "__main__":
    main()
