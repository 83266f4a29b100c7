"""A stand-in for the OpenTelemetry Collector (`otelcol --config <yaml>`), which L0_trace's
test.sh downloads. It reads the part of the collector's configuration the qa uses: the `otlp`
receiver's `http` endpoint, the `batch` processor's `send_batch_size` and `timeout`, and the
`file` exporter's `path`; and it behaves as those three do:

- OTLP/HTTP on `/v1/traces` (protobuf or JSON bodies, gzip or not), answered with an empty
  ExportTraceServiceResponse;
- the batch processor: resource spans gather until `send_batch_size` spans are held, or its timer
  fires (every `timeout`, from the start, restarted after a batch sent for its size);
- the file exporter: the file is truncated at start, and each batch is one line of OTLP JSON
  (`{"resourceSpans":[...]}`, trace and span ids in hex, `parentSpanId` always present); what
  is held is written on SIGTERM (a SIGKILL loses it, as it loses the collector's).

It listens on loopback only, whatever host the endpoint names.
"""
from __future__ import annotations

import argparse
import base64
import gzip
import json
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def duration_s(text: str) -> float:
    """A Go duration as the collector writes them: 10s, 200ms, 1m."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"unsupported duration '{text}'")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2)]


def _hex(b64: str) -> str:
    return base64.b64decode(b64).hex() if b64 else ""


def resource_spans(body: bytes, content_type: str) -> list[dict[str, Any]]:
    """An export request's resource spans in the file exporter's JSON shape."""
    if "json" in content_type:
        return json.loads(body).get("resourceSpans", [])
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    out = MessageToDict(ExportTraceServiceRequest.FromString(body), use_integers_for_enums=True)
    found = out.get("resourceSpans", [])
    for rs in found:
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    span[key] = _hex(span.get(key, ""))
    return found


class Batcher:
    """The batch processor in front of the file exporter."""

    def __init__(self, path: str, size: int, timeout: float) -> None:
        self.out = open(path, "w", encoding="utf-8")
        self.size = size
        self.timeout = timeout
        self.held: list[dict[str, Any]] = []
        self.spans = 0
        self.lock = threading.Lock()
        self.restart = threading.Event()
        threading.Thread(target=self._timer, daemon=True).start()

    def add(self, found: list[dict[str, Any]]) -> None:
        n = sum(len(ss.get("spans", [])) for rs in found for ss in rs.get("scopeSpans", []))
        with self.lock:
            self.held += found
            self.spans += n
            if self.spans >= self.size:
                self._write()
                self.restart.set()

    def _timer(self) -> None:
        while True:
            if self.restart.wait(self.timeout):
                self.restart.clear()
                continue
            with self.lock:
                self._write()

    def _write(self) -> None:
        if self.held:
            self.out.write(json.dumps({"resourceSpans": self.held}, separators=(",", ":")) + "\n")
            self.out.flush()
        self.held, self.spans = [], 0

    def close(self) -> None:
        with self.lock:
            self._write()
            self.out.close()


def handler(batcher: Batcher) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            content_type = self.headers.get("Content-Type", "application/x-protobuf")
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            batcher.add(resource_spans(body, content_type))
            answer = b"{}" if "json" in content_type else b""
            self.send_response(200)
            self.send_header("Content-Type", "application/json" if "json" in content_type else "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    args = p.parse_args()
    import yaml
    with open(args.config, encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    protocols = cfg["receivers"]["otlp"]["protocols"]
    if set(protocols) != {"http"}:
        print(f"otelcol stand-in: only the otlp receiver's http protocol is served, not {sorted(protocols)}",
              file=sys.stderr)
        return 2
    port = int(protocols["http"]["endpoint"].rsplit(":", 1)[1])
    batch = cfg.get("processors", {}).get("batch", {})
    batcher = Batcher(cfg["exporters"]["file"]["path"], int(batch.get("send_batch_size", 8192)),
                      duration_s(batch.get("timeout", "200ms")))
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(batcher))

    def stop(*_: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"otelcol stand-in: OTLP/HTTP on 127.0.0.1:{port}, spans to {cfg['exporters']['file']['path']}", flush=True)
    server.serve_forever()
    server.server_close()
    batcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
