#!/usr/bin/env python3
"""What TLS costs: small-request throughput with TLS and without, in the same run.

  tritond  HTTP JSON  identity_fp32 16 f32   clear vs --http-use-ssl
  tritond  gRPC raw   identity_fp32 16 f32   clear vs --grpc-use-ssl
  Triton   gRPC raw   identity_fp32 16 f32   clear vs --grpc-use-ssl   (real tritonserver)

All servers are started at once on free loopback ports and serve the bench-anchors model
repository (identity_fp32, Python backend); each round measures every case back to back with
perf/loadgen.py (closed loop, c=16 by default; one TLS handshake per connection, then
keep-alive), and the table gives medians over rounds with the ratios TLS/clear and, for gRPC
over TLS, tritond/Triton. Server authentication only (no client certificates), as Triton's
plain --grpc-use-ssl; certificates come from scripts/make-tls-certs.sh.

Real Triton comes from ../shared/bench-anchors (the tritonserver binary of the nvidia-pytriton
wheel); prepare it once, then point --anchors-dir at the same folder:

  ANCHORS_DIR=/tmp/anchors SKIP_PA=1 SKIP_LOADGEN=1 bash ../shared/bench-anchors/run_anchors.sh
  python perf/bench_tls.py --anchors-dir /tmp/anchors [--rounds 3 --duration 3 --concurrency 16]

Without a prepared anchors folder the Triton rows are skipped and tritond serves the example
repository's identity_fp32.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tritond.perf import loadgen
from anchors import Triton
from bench_core import (READY_TIMEOUT_S, ROOT, Server, ServerStartError, build_repository)

MODEL = "identity_fp32"


@dataclass(frozen=True)
class Target:
    """One server and protocol to load, clear or over TLS."""

    server: str         # tritond | Triton
    protocol: str       # http | grpc
    url: str
    tls: loadgen.ClientTls | None

    @property
    def case(self) -> tuple[str, str]:
        return self.server, self.protocol


def anchors_ready(anchors: Path) -> bool:
    return ((anchors / "triton_dist" / "bin" / "tritonserver").exists()
            and (anchors / "models" / "triton" / MODEL).is_dir())


def certificates(dest: Path) -> Path:
    subprocess.run(["bash", str(ROOT / "scripts" / "make-tls-certs.sh"), str(dest)], check=True, capture_output=True)
    return dest


def measure(targets: list[Target], args: argparse.Namespace) -> dict[tuple[str, str, bool], list[loadgen.Result]]:
    inputs = [loadgen.make_input("INPUT0", [16], "FP32")]
    results: dict[tuple[str, str, bool], list[loadgen.Result]] = {}
    for r in range(args.rounds):
        for t in targets:
            res = loadgen.run(t.url, t.protocol, MODEL, inputs, args.concurrency, args.duration, args.warmup, tls=t.tls)
            results.setdefault((*t.case, t.tls is not None), []).append(res)
            print(f"round {r + 1} {t.server} {t.protocol} {'TLS' if t.tls else 'clear'}: "
                  f"{res.infer_per_s:,.0f} infer/s, p50 {res.p50_ms:.2f} ms, errors {res.errors}", file=sys.stderr)
    return results


def render(results: dict[tuple[str, str, bool], list[loadgen.Result]], concurrency: int) -> str:
    def med(key, field="infer_per_s"):
        return statistics.median(getattr(r, field) for r in results[key])

    def per_round_ratio(a, b):
        return statistics.median(x.infer_per_s / y.infer_per_s for x, y in zip(results[a], results[b]))

    rows = ["| server | protocol | clear infer/s | TLS infer/s | clear p50 ms | TLS p50 ms | TLS / clear | errors |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for server, protocol in dict.fromkeys((s, p) for s, p, _ in results):
        clear, tls = (server, protocol, False), (server, protocol, True)
        errors = sum(r.errors for r in results[clear] + results[tls])
        rows.append(f"| {server} | {protocol} | {med(clear):,.0f} | {med(tls):,.0f} | {med(clear, 'p50_ms'):.2f} "
                    f"| {med(tls, 'p50_ms'):.2f} | {per_round_ratio(tls, clear):.2f} | {errors} |")
    text = "\n".join(rows)
    if ("Triton", "grpc", True) in results:
        text += (f"\n\ntritond / Triton, gRPC over TLS, c={concurrency}: "
                 f"{per_round_ratio(('tritond', 'grpc', True), ('Triton', 'grpc', True)):.2f}"
                 f"  (clear text: {per_round_ratio(('tritond', 'grpc', False), ('Triton', 'grpc', False)):.2f})")
    return text + "\n\nmedians over rounds; ratios are medians of per-round ratios (same-round baselines)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anchors-dir", type=Path, default=Path(os.environ.get("ANCHORS_DIR", "/tmp/anchors")),
                   help="a bench-anchors folder prepared by run_anchors.sh (Triton rows are skipped without it)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds per case and round")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per case and round")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_tls_") as tmp_name:
        tmp = Path(tmp_name)
        pki = certificates(tmp / "tls")
        client = loadgen.ClientTls(str(pki / "ca.crt"))
        with_triton = anchors_ready(args.anchors_dir)
        if with_triton:
            repository = args.anchors_dir / "models" / "triton"
        else:
            print(f"no prepared bench-anchors folder at {args.anchors_dir}: Triton rows skipped", file=sys.stderr)
            repository = tmp / "models"
            build_repository(repository)
        cert = [f"--{proto}-{flag}={pki / name}" for proto in ("http", "grpc")
                for flag, name in (("server-cert", "server.crt"), ("server-key", "server.key"))]
        only = ["--model-control-mode=explicit", f"--load-model={MODEL}", "--allow-metrics=false"]
        servers = []
        try:
            clear = Server(repository, tmp / "tritond-clear.log", only)
            tls = Server(repository, tmp / "tritond-tls.log", only + ["--http-use-ssl", "--grpc-use-ssl"] + cert,
                         https=client.ssl_context())
            servers += [clear, tls]
            targets = [Target("tritond", "http", clear.http, None), Target("tritond", "http", tls.http, client),
                       Target("tritond", "grpc", clear.grpc, None), Target("tritond", "grpc", tls.grpc, client)]
            if with_triton:
                grpc_tls = ["--grpc-use-ssl=true", f"--grpc-server-cert={pki / 'server.crt'}",
                            f"--grpc-server-key={pki / 'server.key'}"]
                served = ["--model-control-mode=explicit", f"--load-model={MODEL}"]
                t_clear = Triton(args.anchors_dir, repository, tmp / "triton-clear.log", served)
                t_tls = Triton(args.anchors_dir, repository, tmp / "triton-tls.log", served + grpc_tls)
                servers += [t_clear, t_tls]
                targets += [Target("Triton", "grpc", t_clear.grpc, None), Target("Triton", "grpc", t_tls.grpc, client)]
            for s in servers:
                s.wait_ready(READY_TIMEOUT_S)
            results = measure(targets, args)
        except (ServerStartError, loadgen.LoadgenError) as exc:
            sys.exit(str(exc))
        finally:
            for s in servers:
                s.stop()
    print(f"identity_fp32, 16 f32, c={args.concurrency}, {args.rounds} rounds of {args.duration:g} s\n")
    print(render(results, args.concurrency))


if __name__ == "__main__":
    main()
