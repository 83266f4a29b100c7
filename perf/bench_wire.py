#!/usr/bin/env python3
"""Encode + decode cost of the per-request messages, with gc=False (as wire/schema.py has them)
and without (the same schema with every `gc=False` removed), in one run.

Each message is encoded and decoded in a loop with the cycle collector on, the decoded ones
kept in a ring of RING (the requests a broker holds at once), so collections happen as they do
in a running server. Rounds alternate between the two schemas; the best round counts.

  python perf/bench_wire.py [--n 20000] [--rounds 7]

It then prints what an inline tensor's bytes cost the broker: decoding a frontend's Infer and
encoding the Exec that carries its inputs on, for inline sizes up to INLINE_MAX (the copies the
broker makes of those bytes are the difference from the smallest size).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections import deque
from types import ModuleType
from typing import Any, Callable

import tritond.wire.schema as schema

RING = 1024


def without_gc_flag() -> ModuleType:
    """wire/schema.py loaded again with every `, gc=False` removed."""
    spec = importlib.util.find_spec(schema.__name__)
    source = spec.loader.get_source(schema.__name__).replace(", gc=False", "")
    module = ModuleType("tritond.wire.schema_gc")
    module.__package__ = "tritond.wire"
    sys.modules[module.__name__] = module
    exec(compile(source, spec.origin, "exec"), module.__dict__)
    return module


def messages(S: ModuleType) -> dict[str, tuple[Any, Any]]:
    """name -> (message, the union it is decoded against)."""
    def block(i: int) -> Any:
        return S.TensorDesc(f"INPUT{i}", "FP32", [1, 16], S.Block("tritond.x.fe.1", 4096 * i, 64, 10 + i))

    infer = S.Infer(7, "identity_fp32", inputs=[block(0), block(1)], outputs=[S.OutputSpec("OUTPUT0")],
                    id="r7", params={"tag": "a", "n": 3})
    inline = S.Infer(8, "identity_fp32", inputs=[S.TensorDesc("INPUT0", "FP32", [1, 16], S.Inline(bytes(64)))])
    exec_ = S.Exec(3, [S.ExecRequest([block(0)], [S.OutputSpec("OUTPUT0")], key=k) for k in range(8)])
    return {
        "TensorDesc": (block(0), S.TensorDesc),
        "Infer (2 shm inputs)": (infer, S.FrontendMsg),
        "Infer (inline 64 B)": (inline, S.FrontendMsg),
        "Exec (8 requests)": (exec_, S.BrokerToWorker),
        "Release (4 leases)": (S.Release(b"fe-1", [1, 2, 3, 4]), S.FrontendMsg),
        "Heartbeat": (S.Heartbeat(1000), S.WorkerMsg),
        "Credit": (S.Credit(7, 16), S.FrontendMsg),
    }


def round_us(msg: Any, decode: Callable[[bytes], Any], n: int) -> float:
    encode = schema.encode
    ring: deque = deque(maxlen=RING)
    keep = ring.append
    t0 = time.perf_counter_ns()
    for _ in range(n):
        keep(decode(encode(msg)))
    return (time.perf_counter_ns() - t0) / n / 1000


def relay_us(size: int, n: int) -> float:
    """Infer (one inline input of `size` bytes) decoded, then its inputs encoded in an Exec."""
    frame = schema.encode(schema.Infer(1, "identity_fp32", inputs=[
        schema.TensorDesc("INPUT0", "UINT8", [size], schema.Inline(bytes(size)))]))
    decode, encode = schema.decoder(schema.FrontendMsg).decode, schema.encode
    Exec, ExecRequest = schema.Exec, schema.ExecRequest
    t0 = time.perf_counter_ns()
    for _ in range(n):
        encode(Exec(1, [ExecRequest(decode(frame).inputs)]))
    return (time.perf_counter_ns() - t0) / n / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    variants = {"gc=False": schema, "gc=True": without_gc_flag()}
    cases = {name: messages(S) for name, S in variants.items()}
    print(f"{'message':24} {'gc=False µs':>12} {'gc=True µs':>11} {'ratio':>6}")
    for name in cases["gc=False"]:
        best = {v: float("inf") for v in variants}
        runs = {v: (cases[v][name][0], variants[v].decoder(cases[v][name][1]).decode) for v in variants}
        for _ in range(args.rounds):
            for v, (msg, decode) in runs.items():
                best[v] = min(best[v], round_us(msg, decode, args.n))
        print(f"{name:24} {best['gc=False']:12.3f} {best['gc=True']:11.3f} {best['gc=False'] / best['gc=True']:6.2f}")
    print(f"\n{'inline bytes':>12} {'broker relay µs':>16}")
    size = 64
    while size <= schema.INLINE_MAX:
        print(f"{size:12} {min(relay_us(size, args.n) for _ in range(args.rounds)):16.3f}")
        size *= 4


if __name__ == "__main__":
    main()
