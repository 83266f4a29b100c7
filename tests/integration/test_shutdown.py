"""Graceful shutdown on SIGTERM, over HTTP and gRPC: new requests are refused with 503 /
UNAVAILABLE, in-flight requests complete and the server exits 0; past --exit-timeout-secs the
in-flight requests are cancelled with an error and the exit code is 2."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, serving, wait_for
from fault_models import add_fault_model, started

def build(root: Path) -> tuple[Path, Path]:
    repo, markers = root / "models", root / "markers"
    markers.mkdir(parents=True)
    for name in ("slow", "other"):
        add_fault_model(repo, name, max_batch=8, batching="max_queue_delay_microseconds: 100000",
                        params={"marker_dir": markers})
    return repo, markers


class Protocol:
    """Just enough of either client to send one request and read its error status."""

    def __init__(self, kind: str, server: TritondServer) -> None:
        self.kind = kind
        self.mod = httpclient if kind == "http" else grpcclient
        self.url = server.http_url if kind == "http" else server.grpc_url
        self.unavailable = "503" if kind == "http" else "StatusCode.UNAVAILABLE"

    def infer(self, model: str, sleep_ms: int = 0):
        if self.kind == "http":
            client = httpclient.InferenceServerClient(self.url, network_timeout=120, connection_timeout=120)
        else:
            client = grpcclient.InferenceServerClient(self.url)
        inp = self.mod.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
        try:
            return client.infer(model, [inp], parameters={"sleep_ms": sleep_ms} if sleep_ms else None)
        finally:
            client.close()


def send_in_background(proto: Protocol, n: int, sleep_ms: int) -> tuple[list, list[threading.Thread]]:
    outcomes: list = []

    def one() -> None:
        try:
            outcomes.append(proto.infer("slow", sleep_ms))
        except InferenceServerException as e:
            outcomes.append(e)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return outcomes, threads


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_sigterm_drains_in_flight_requests_and_refuses_new_ones(tmp_path, kind):
    repo, markers = build(tmp_path)
    with serving(TritondServer(repo, grpc=kind == "grpc")) as s:
        proto = Protocol(kind, s)
        proto.infer("other")
        outcomes, threads = send_in_background(proto, 4, 3000)
        wait_for(lambda: started(markers) == 5, what="the slow requests to start")
        s.send_signal(signal.SIGTERM)

        def refused_new() -> InferenceServerException | None:
            try:
                proto.infer("other")
            except InferenceServerException as e:
                return e
            return None
        refused = wait_for(refused_new, 30, "a new request to be refused")
        assert refused.status() == proto.unavailable, refused
        for t in threads:
            t.join(120)
        assert len(outcomes) == 4
        for r in outcomes:
            assert not isinstance(r, InferenceServerException), r
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), np.ones((1, 2)))
        s.proc.wait(120)
        assert s.log.count("Waiting for in-flight requests to complete.") == 1      # tritonserver's words


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_in_flight_requests_past_the_exit_timeout_are_cancelled(tmp_path, kind):
    repo, markers = build(tmp_path)
    with serving(TritondServer(repo, ["--exit-timeout-secs", "2"], grpc=kind == "grpc"), code=2) as s:
        proto = Protocol(kind, s)
        outcomes, threads = send_in_background(proto, 3, 60000)
        wait_for(lambda: started(markers) == 3, what="the slow requests to start")
        s.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        s.proc.wait(120)
    assert len(outcomes) == 3
    for e in outcomes:
        assert isinstance(e, InferenceServerException) and e.status() == proto.unavailable, e
        assert "exit timeout" in e.message()
    assert "cancelled" in s.log
