#!/usr/bin/env python3
"""Streaming and stateful benchmark: tritond against real Triton in the same run.

(a) Streamed responses: the decoupled toy_llm (examples/) answers each request with 256 small
    responses (one token each, no pacing) over a gRPC ModelStreamInfer stream and over
    generate_stream (SSE), at each concurrency level (closed loop, one stream or connection per
    client). Reported: responses/s, time to the first token and the gap between tokens (the
    per-token latency the server adds, since the model itself emits as fast as it can).
(b) Sequences: the stateful accumulator (examples/, implicit state) with 64 concurrent
    sequences of `--steps` requests each (START ... END, then a new sequence), over gRPC and
    over HTTP (JSON), with the direct strategy (the example's config: 8 slots) and the oldest strategy
    (max_candidate_sequences 64, max_batch_size 8). Reported: requests/s. tritond's answers are
    checked against the running sums; Triton's Python backend does not update implicit state
    (it has no state API), so its answers are not checked, only timed.

Servers take turns case by case within each round; figures are medians over rounds, and the
ratio is tritond / Triton per round, then the median.

  ANCHORS_DIR=/tmp/anchors SKIP_PA=1 SKIP_LOADGEN=1 bash ../shared/bench-anchors/run_anchors.sh  # once
  python perf/bench_streaming.py --anchors-dir /tmp/anchors [--rounds 3 --duration 4]

Without a prepared anchors folder only tritond is measured.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from anchors import Triton, anchors_ready
from bench_core import READY_TIMEOUT_S, Server, build_repository
from tritond.perf.loadgen import HttpConnection, split_target

from tritond.perf.sse import closed_loop

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
INFER = "/inference.GRPCInferenceService/ModelInfer"
OLDEST = "oldest { max_candidate_sequences: 64 }"
READ_TIMEOUT_S = 30.0    # a response this late counts as an error (and ends that client)


def repository(dest: Path) -> Path:
    build_repository(dest, ["toy_llm", "accumulator"])
    (dest / "acc_oldest" / "1").mkdir(parents=True)
    shutil.copyfile(dest / "accumulator" / "1" / "model.py", dest / "acc_oldest" / "1" / "model.py")
    config = (dest / "accumulator" / "config.pbtxt").read_text()
    (dest / "acc_oldest" / "config.pbtxt").write_text(
        config.replace('name: "accumulator"', 'name: "acc_oldest"').replace("direct { }", OLDEST))
    return dest


# ---------------------------------------------------------------- (a) streamed responses

@dataclass
class Stream:
    responses: int = 0
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    errors: int = 0


def llm_request(i: int, tokens: int) -> bytes:
    from tritonclient.grpc import service_pb2 as pb
    r = pb.ModelInferRequest(model_name="toy_llm", id=str(i))
    prompt = f"prompt number {i}".encode()
    t = r.inputs.add(name="text_input", datatype="BYTES")
    t.shape.append(1)
    r.raw_input_contents.append(len(prompt).to_bytes(4, "little") + prompt)
    m = r.inputs.add(name="max_tokens", datatype="INT32")
    m.shape.append(1)
    r.raw_input_contents.append(np.array([tokens], np.int32).tobytes())
    return r.SerializeToString()


async def grpc_streamer(target: str, tokens: int, until: float, start: float, out: Stream, seed: int) -> None:
    """One client on one long-lived stream: a request, its `tokens` responses, the next."""
    import grpc
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.stream_stream(STREAM, request_serializer=None, response_deserializer=None)()
        i = seed
        while time.perf_counter() < until:
            i += 1
            t0 = time.perf_counter()
            await call.write(llm_request(i, tokens))
            last = t0
            for k in range(tokens):
                try:
                    raw = await asyncio.wait_for(call.read(), READ_TIMEOUT_S)
                except asyncio.TimeoutError:
                    raw = None
                now = time.perf_counter()
                if raw is grpc.aio.EOF or not raw or raw[0] != 0x12:      # 0x12: infer_response, else error
                    print(f"gRPC stream to {target}: response {k} of request {i} is "
                          f"{'late' if raw is None else repr(raw[:80])}", file=sys.stderr)
                    out.errors += 1
                    return
                if now >= start:
                    out.responses += 1
                    (out.ttft if k == 0 else out.gaps).append(now - last)
                last = now
        await call.done_writing()


async def sse_streamer(target: str, tokens: int, until: float, start: float, out: Stream, seed: int) -> None:
    """One client on one keep-alive connection: POST generate_stream, read the events, repeat."""
    host, port = split_target(target)

    def request(i: int) -> bytes:
        body = f'{{"text_input": "prompt number {i}", "max_tokens": {tokens}}}'.encode()
        return (f"POST /v2/models/toy_llm/generate_stream HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    try:
        async with aclosing(closed_loop(host, port, request, seed, until, READ_TIMEOUT_S)) as requests:
            async for _, last, events in requests:
                seen = 0
                async for now, count in events:
                    for _ in range(count):
                        if now >= start:
                            out.responses += 1
                            (out.ttft if seen == 0 else out.gaps).append(now - last)
                        seen += 1
                    last = now
                if seen != tokens:
                    out.errors += 1
    except (asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError, ConnectionError) as e:
        print(f"SSE stream to {target}: ended early ({type(e).__name__}: {e})", file=sys.stderr)
        out.errors += 1


async def run_streams(kind: str, target: str, concurrency: int, tokens: int, warmup: float,
                      duration: float) -> tuple[float, Stream]:
    out = Stream()
    start = time.perf_counter() + warmup
    until = start + duration
    client = grpc_streamer if kind == "grpc" else sse_streamer
    await asyncio.gather(*(client(target, tokens, until, start, out, 1000 * c) for c in range(concurrency)))
    return out.responses / (time.perf_counter() - start), out


# ---------------------------------------------------------------- (b) sequences

def step_request(model: str, corrid: int, x: float, start: bool, end: bool) -> bytes:
    from tritonclient.grpc import service_pb2 as pb
    r = pb.ModelInferRequest(model_name=model)
    r.parameters["sequence_id"].int64_param = corrid
    r.parameters["sequence_start"].bool_param = start
    r.parameters["sequence_end"].bool_param = end
    t = r.inputs.add(name="INPUT", datatype="FP32")
    t.shape.extend([1, 1])
    r.raw_input_contents.append(np.array([[x]], np.float32).tobytes())
    return r.SerializeToString()


async def sequence_client(call, model: str, steps: int, until: float, start: float, counts: list[int],
                          client: int, check: bool) -> None:
    """Sequences of `steps` requests, one after the other; counts[1] gets the wrong sums."""
    n = 0
    while time.perf_counter() < until:
        n += 1
        corrid = client * 1_000_000 + n
        total = np.float32(0)
        for i in range(steps):
            x = float(i + 1)
            got = await call(model, corrid, x, i == 0, i == steps - 1)
            if time.perf_counter() >= start:
                counts[0] += 1
            total = np.float32(total + np.float32(x))
            if check and got != total:
                counts[1] += 1


def http_step(host: str, model: str, corrid: int, x: float, start: bool, end: bool) -> bytes:
    body = (f'{{"parameters": {{"sequence_id": {corrid}, "sequence_start": {str(start).lower()}, '
            f'"sequence_end": {str(end).lower()}}}, "inputs": [{{"name": "INPUT", "shape": [1, 1], '
            f'"datatype": "FP32", "data": [{x}]}}]}}').encode()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
            f"\r\n").encode() + body


def http_caller(target: str):
    """An awaitable call(model, corrid, x, start, end) -> OUTPUT on its own keep-alive connection."""
    host, port = split_target(target)
    conn = HttpConnection(host, port)

    async def call(model: str, corrid: int, x: float, start: bool, end: bool) -> float:
        status, body = await conn.send(http_step(host, model, corrid, x, start, end))
        if status != 200:
            raise RuntimeError(body[:200])
        return float(json.loads(body)["outputs"][0]["data"][0])
    return call, conn.close


def grpc_caller(call):
    from tritonclient.grpc import service_pb2 as pb

    async def infer(model: str, corrid: int, x: float, start: bool, end: bool) -> float:
        raw = await call(step_request(model, corrid, x, start, end))
        return float(np.frombuffer(pb.ModelInferResponse.FromString(raw).raw_output_contents[0], np.float32)[0])
    return infer


async def run_sequences(protocol: str, target: str, model: str, sequences: int, steps: int, warmup: float,
                        duration: float, check: bool) -> tuple[float, int]:
    import grpc
    channels = [grpc.aio.insecure_channel(target) for _ in range(4)] if protocol == "grpc" else []
    calls = [grpc_caller(ch.unary_unary(INFER, request_serializer=None, response_deserializer=None))
             for ch in channels]
    closers = []
    if protocol == "http":
        for _ in range(sequences):
            call, close = http_caller(target)
            calls.append(call)
            closers.append(close)
    counts = [0, 0]
    start = time.perf_counter() + warmup
    until = start + duration
    try:
        await asyncio.gather(*(sequence_client(calls[c % len(calls)], model, steps, until, start, counts, c, check)
                               for c in range(sequences)))
    finally:
        for ch in channels:
            await ch.close()
        for close in closers:
            close()
    return counts[0] / (time.perf_counter() - start), counts[1]


# ---------------------------------------------------------------- the run

def ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anchors-dir", type=Path, default=Path("/tmp/anchors"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cases", default="grpc,sse,direct,oldest,direct-http,oldest-http")
    args = p.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    cases = args.cases.split(",")

    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
        tmp_path = Path(tmp)
        servers: dict[str, object] = {"tritond": Server(repository(tmp_path / "tritond"), tmp_path / "tritond.log")}
        if anchors_ready(args.anchors_dir):
            servers["Triton"] = Triton(args.anchors_dir, repository(tmp_path / "triton"), tmp_path / "triton.log")
        else:
            print(f"no prepared bench-anchors folder at {args.anchors_dir}: Triton rows skipped", file=sys.stderr)
        try:
            for s in servers.values():
                s.wait_ready(READY_TIMEOUT_S)
            rows: dict[tuple, dict[str, list]] = {}
            for r in range(args.rounds):
                for case in cases:
                    levels = concurrency if case in ("grpc", "sse") else [args.sequences]
                    for c in levels:
                        for name, s in servers.items():
                            key = (case, c)
                            if case in ("grpc", "sse"):
                                target = s.grpc if case == "grpc" else s.http
                                rate, st = asyncio.run(run_streams(case, target, c, args.tokens, args.warmup,
                                                                   args.duration))
                                cell = (rate, ms(st.ttft, 50), ms(st.gaps, 50), ms(st.gaps, 99), st.errors)
                            else:
                                model = "accumulator" if case.startswith("direct") else "acc_oldest"
                                protocol = "http" if case.endswith("-http") else "grpc"
                                target = s.http if protocol == "http" else s.grpc
                                rate, wrong = asyncio.run(run_sequences(protocol, target, model, c, args.steps,
                                                                        args.warmup, args.duration, name == "tritond"))
                                cell = (rate, wrong)
                            rows.setdefault(key, {}).setdefault(name, []).append(cell)
                            print(f"round {r + 1} {case} c={c} {name}: {cell}", file=sys.stderr, flush=True)
            print(render(rows, list(servers), args))
        finally:
            for s in servers.values():
                s.stop()


def render(rows: dict, names: list[str], args: argparse.Namespace) -> str:
    out = [f"tokens/request {args.tokens}, sequences of {args.steps} steps, {args.rounds} rounds x "
           f"{args.duration:g} s (medians)", ""]
    out.append("| case | conc | " + " | ".join(f"{n} resp/s or req/s" for n in names) + " | "
               + " | ".join(f"{n} TTFT p50 / gap p50 / gap p99 ms" for n in names) + " | x Triton |")
    out.append("|---|---:|" + "---:|" * (2 * len(names)) + "---:|")
    label = {"grpc": "a: 256 tokens, gRPC stream", "sse": "a: 256 tokens, generate_stream SSE",
             "direct": "b: sequences, direct, gRPC", "oldest": "b: sequences, oldest, gRPC",
             "direct-http": "b: sequences, direct, HTTP", "oldest-http": "b: sequences, oldest, HTTP"}
    for (case, c), by in rows.items():
        rates = [f"{statistics.median(x[0] for x in by[n]):,.0f}" for n in names]
        lat = []
        for n in names:
            if case in ("grpc", "sse"):
                lat.append(" / ".join(f"{statistics.median(x[i] for x in by[n]):.2f}" for i in (1, 2, 3)))
            else:
                lat.append("")
        ratio = ""
        if "Triton" in by:
            ratio = f"{statistics.median(a[0] / b[0] for a, b in zip(by['tritond'], by['Triton']) if b[0]):.2f}"
        problems = sum(x[-1] for x in by["tritond"])
        note = f" ({problems} errors or wrong sums)" if problems else ""
        out.append(f"| {label[case]}{note} | {c} | " + " | ".join(rates) + " | " + " | ".join(lat) + f" | {ratio} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
