#!/usr/bin/env python3
"""Ensemble benchmark: one call to search_pipeline_ensemble against the client chaining the
two models itself, for ~1 MB images (raw RGB, 578 x 578 x 3 bytes).

  ensemble   POST search_pipeline_ensemble (RAW_IMAGE) -> EMBEDDING; the [3,224,224] FP32
             intermediate passes between the two workers in shared memory
  two calls  POST image_preprocess_model (RAW_IMAGE) -> IMAGE (602 KB back to the client),
             then POST image_encoder_onnx (IMAGE, 602 KB again) -> EMBEDDING

Both over HTTP with the binary tensor extension, closed loop, at each concurrency level, in
one run against one server, with two kinds of client: "raw" sends pre-built requests on
keep-alive sockets and forwards the intermediate bytes untouched (the least client work
possible), "tritonclient" is what an application would write (tritonclient.http, numpy in
and out, one client per thread). The ratios say how much faster the ensemble is end to end.
Last it prints the ensemble's own cost per step, from the server's statistics over ensemble calls
made before the comparison.

  python perf/bench_ensemble.py --start                  # start tritond on the example repository
  python perf/bench_ensemble.py --http 127.0.0.1:8000    # a server that is already running
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import bench_core
from tritond.perf import loadgen

SIDE = 578                       # 3 * 578 * 578 = 1,002,252 bytes
ENSEMBLE = "search_pipeline_ensemble"
PRE, ENCODER = "image_preprocess_model", "image_encoder_onnx"
GRACE_S = 30.0


@dataclass(frozen=True)
class Point:
    infer_per_s: float
    p50_ms: float
    p99_ms: float
    count: int
    errors: int


def raw_image(seed: int = 0) -> loadgen.Input:
    pixels = np.random.default_rng(seed).integers(0, 256, 3 * SIDE * SIDE, dtype=np.uint8).tobytes()
    return loadgen.Input("RAW_IMAGE", "BYTES", np.array([[pixels]], dtype=object))


def split_binary(body: bytes) -> tuple[dict, memoryview]:
    """An HTTP binary-extension response: its JSON header and the bytes after it."""
    header, end = json.JSONDecoder().raw_decode(body[:8192].decode("latin-1"))
    return header, memoryview(body)[end:]


def output(body: bytes, name: str) -> tuple[list[int], memoryview]:
    header, data = split_binary(body)
    offset = 0
    for o in header["outputs"]:
        size = o["parameters"]["binary_data_size"]
        if o["name"] == name:
            return o["shape"], data[offset:offset + size]
        offset += size
    raise loadgen.RequestFailed(f"no output {name} in {header}")


def encoder_request(host: str, port: int, shape: list[int], image: memoryview) -> bytes:
    head = json.dumps({"inputs": [{"name": "IMAGE", "shape": shape, "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(image)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    lines = [f"POST /v2/models/{ENCODER}/infer HTTP/1.1", f"Host: {host}:{port}",
             "Content-Type: application/octet-stream", f"Inference-Header-Content-Length: {len(head)}",
             f"Content-Length: {len(head) + len(image)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + head + image


def senders(target: str, concurrency: int, two_calls: bool):
    host, port = loadgen.split_target(target)
    image = [raw_image()]
    first = loadgen.http_request(host, port, PRE if two_calls else ENSEMBLE, image, True)
    conns = [loadgen.HttpConnection(host, port) for _ in range(concurrency)]

    async def call(conn: loadgen.HttpConnection, request: bytes) -> bytes:
        status, body = await conn.send(request)
        if status != 200:
            raise loadgen.RequestFailed(f"HTTP {status}: {body[:300].decode(errors='replace')}")
        return body

    def sender(conn: loadgen.HttpConnection):
        async def send() -> None:
            body = await call(conn, first)
            if two_calls:
                shape, data = output(body, "IMAGE")
                body = await call(conn, encoder_request(host, port, shape, data))
            shape, _ = output(body, "EMBEDDING")
            if shape != [1, 512]:
                raise loadgen.RequestFailed(f"EMBEDDING shape {shape}")
        return send

    return [sender(c) for c in conns], conns


def point(latencies: list[float], duration: float, errors: int) -> Point:
    ms = np.array(latencies) * 1e3 if latencies else np.array([np.nan])
    return Point(len(latencies) / duration, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)),
                 len(latencies), errors)


async def measure_raw(target: str, concurrency: int, two_calls: bool, duration: float,
                      warmup: float) -> tuple[list[float], int]:
    """Closed loop: each worker sends, waits for the result, sends again; only completions
    inside the measured window count. Returns their latencies and the number of errors."""
    workers, conns = senders(target, concurrency, two_calls)
    await workers[0]()               # a probe: fail loudly instead of counting errors
    start = time.perf_counter()
    window = (start + warmup, start + warmup + duration)
    latencies: list[float] = []
    errors = 0

    async def loop(send) -> None:
        nonlocal errors
        while (begin := time.perf_counter()) < window[1]:
            try:
                await send()
            except Exception:
                errors += 1
                await asyncio.sleep(0.01)
                continue
            end = time.perf_counter()
            if window[0] <= end <= window[1]:
                latencies.append(end - begin)

    try:
        await asyncio.wait_for(asyncio.gather(*(loop(w) for w in workers)), warmup + duration + GRACE_S)
    finally:
        for c in conns:
            c.close()
    return latencies, errors


def tritonclient_call(target: str, two_calls: bool):
    """One image through the pipeline as an application would write it with tritonclient."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(target, network_timeout=GRACE_S)
    raw = httpclient.InferInput("RAW_IMAGE", [1, 1], "BYTES")
    raw.set_data_from_numpy(raw_image().data, binary_data=True)

    def infer(model: str, inp, name: str) -> np.ndarray:
        return client.infer(model, [inp], outputs=[httpclient.InferRequestedOutput(name, binary_data=True)]).as_numpy(name)

    def call() -> None:
        if two_calls:
            image = infer(PRE, raw, "IMAGE")
            inp = httpclient.InferInput("IMAGE", list(image.shape), "FP32")
            inp.set_data_from_numpy(image, binary_data=True)
            embedding = infer(ENCODER, inp, "EMBEDDING")
        else:
            embedding = infer(ENSEMBLE, raw, "EMBEDDING")
        if embedding.shape != (1, 512):
            raise loadgen.RequestFailed(f"EMBEDDING shape {embedding.shape}")
    return call


def measure_tritonclient(target: str, concurrency: int, two_calls: bool, duration: float,
                         warmup: float) -> tuple[list[float], int]:
    """The same closed loop with one thread (and client, made in that thread: tritonclient.http
    runs on gevent, whose hub is per thread) per concurrent request."""
    tritonclient_call(target, two_calls)()
    start = time.perf_counter()
    window = (start + warmup, start + warmup + duration)
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def loop() -> None:
        nonlocal errors
        call = tritonclient_call(target, two_calls)
        while (begin := time.perf_counter()) < window[1]:
            try:
                call()
            except Exception:
                with lock:
                    errors += 1
                time.sleep(0.01)
                continue
            end = time.perf_counter()
            if window[0] <= end <= window[1]:
                with lock:
                    latencies.append(end - begin)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(warmup + duration + GRACE_S)
    return latencies, errors


CLIENTS = {
    "raw": lambda *a: asyncio.run(measure_raw(*a)),
    "tritonclient": measure_tritonclient,
}


def render(points: dict[tuple[str, int, bool], Point], clients: list[str], levels: list[int]) -> str:
    rows = ["| client | conc | path | images/s | p50 ms | p99 ms | count | errors |",
            "|---|---:|---|---:|---:|---:|---:|---:|"]
    ratios = []
    for client in clients:
        for conc in levels:
            for two_calls in (False, True):
                p = points[(client, conc, two_calls)]
                path = "two calls (client chains)" if two_calls else "ensemble (one call)"
                rows.append(f"| {client} | {conc} | {path} | {p.infer_per_s:,.1f} | {p.p50_ms:.2f} | {p.p99_ms:.2f} "
                            f"| {p.count} | {p.errors} |")
            e, t = points[(client, conc, False)], points[(client, conc, True)]
            ratios.append(f"{client} client, c={conc}: ensemble throughput {e.infer_per_s / t.infer_per_s:.2f}x, "
                          f"p50 latency {t.p50_ms / e.p50_ms:.2f}x lower")
    return "\n".join(rows) + "\n\n" + "\n".join(ratios)


def bench(target: str, clients: list[str], levels: list[int], duration: float, warmup: float, rounds: int) -> str:
    """Each point is measured in `rounds` slices alternating with the other path, so a load
    change on a shared machine shifts both paths alike instead of skewing the ratio."""
    points = {}
    for client in clients:
        for conc in levels:
            samples: dict[bool, list[float]] = {False: [], True: []}
            errors = {False: 0, True: 0}
            for _ in range(rounds):
                for two_calls in (False, True):
                    latencies, failed = CLIENTS[client](target, conc, two_calls, duration / rounds, warmup)
                    samples[two_calls] += latencies
                    errors[two_calls] += failed
            for two_calls in (False, True):
                points[(client, conc, two_calls)] = point(samples[two_calls], duration, errors[two_calls])
    return render(points, clients, levels)


def step_overhead(http: str, requests: int = 300) -> str:
    """The ensemble's own cost per step: its mean success time less its two steps' (the server's
    statistics over `requests` ensemble calls, one at a time, before the comparison runs)."""
    import tritonclient.http as httpclient
    client = httpclient.InferenceServerClient(http, network_timeout=120)
    try:
        image = raw_image()
        inp = httpclient.InferInput(image.name, list(image.data.shape), image.datatype)
        inp.set_data_from_numpy(image.data, binary_data=True)

        def success() -> dict[str, tuple[int, int]]:
            out = {}
            for name in (ENSEMBLE, PRE, ENCODER):
                s = client.get_inference_statistics(name)["model_stats"][0]["inference_stats"]["success"]
                out[name] = (s["count"], s["ns"])
            return out

        for _ in range(20):
            client.infer(ENSEMBLE, [inp])
        before = success()
        for _ in range(requests):
            client.infer(ENSEMBLE, [inp])
        after = success()
    finally:
        client.close()
    us = {n: (after[n][1] - before[n][1]) / max(1, after[n][0] - before[n][0]) / 1e3 for n in after}
    per_step = (us[ENSEMBLE] - us[PRE] - us[ENCODER]) / 2
    return (f"ensemble {us[ENSEMBLE]:.0f} µs per request = {PRE} {us[PRE]:.0f} + {ENCODER} {us[ENCODER]:.0f} "
            f"+ its own {per_step:.0f} µs per step ({requests} requests, server statistics)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--http", help="host:port of a running server's HTTP endpoint")
    target.add_argument("--start", action="store_true", help="start tritond on free ports and stop it afterwards")
    p.add_argument("--repository", type=Path, help="built example repository (default: build one in a temp dir)")
    p.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8])
    p.add_argument("--clients", type=lambda s: s.split(","), default=list(CLIENTS), help="raw,tritonclient")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each slice")
    p.add_argument("--rounds", type=int, default=3, help="slices per point, alternating the two paths")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_ensemble_") as tmp:
        repository = args.repository
        if repository is None and args.start:
            repository = Path(tmp) / "models"
            bench_core.build_repository(repository)
        server = None
        try:
            if args.start:
                server = bench_core.Server(repository, Path(tmp) / "tritond.log")
                server.wait_ready(bench_core.READY_TIMEOUT_S)
            http = server.http if server else args.http
            overhead = step_overhead(http)
            report = bench(http, args.clients, args.concurrency, args.duration, args.warmup, args.rounds)
        except bench_core.ServerStartError as exc:
            sys.exit(str(exc))
        except (loadgen.RequestFailed, OSError) as exc:
            sys.exit(f"{exc}\n{server.log_tail()}" if server else str(exc))
        finally:
            if server is not None:
                server.stop()
    print(report)
    print(overhead)


if __name__ == "__main__":
    main()
