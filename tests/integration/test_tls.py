"""TLS and mutual TLS on the gRPC and HTTP ports, through the real clients: tritonclient.grpc
and tritonclient.http with their ssl options, and perf_analyzer with its --ssl-* flags.
Clients without a certificate, with one from another CA, or speaking clear text are refused;
management APIs can be limited to a certificate subject; every bad certificate file stops
startup; SIGHUP swaps certificates under load without losing a request.

Certificates are made per test session by tests/tls_certs.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import gevent.ssl
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, free_port, http_get, serving, wait_for
from test_perf_analyzer import THROUGHPUT, perf_analyzer
from tls_certs import DAY, Issued, issue, make_ca

REFUSED = (OSError, http.client.HTTPException)   # ssl.SSLError, connection reset or closed
X = np.arange(16, dtype=np.float32)


@dataclass
class Pki:
    root: Path
    ca: Issued
    server: Issued
    next_server: Issued
    client: Issued
    admin: Issued
    stranger: Issued      # a client certificate from another CA
    live: Path            # the server's certificate files, which rotation rewrites

    @property
    def live_cert(self) -> Path:
        return self.live / "server.crt"

    @property
    def live_key(self) -> Path:
        return self.live / "server.key"

    def serve(self, issued: Issued | None = None, cert: bytes | None = None) -> None:
        """Put a certificate in place the way a rotation would: each file replaced at once."""
        issued = issued or self.server
        new = ((self.live_key, issued.key.read_bytes()), (self.live_cert, cert or issued.cert.read_bytes()))
        for path, data in new:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)

    def context(self, who: Issued | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        if who is not None:
            ctx.load_cert_chain(str(who.cert), str(who.key))
        return ctx


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = make_ca(root)
    other = make_ca(root, "other-ca", "another CA")
    live = root / "live"
    live.mkdir()
    p = Pki(root, ca, issue(root, "server", ca, "localhost", server=True),
            issue(root, "next-server", ca, "localhost", server=True),
            issue(root, "client", ca, "tritond-client", "tests"),
            issue(root, "admin", ca, "tritond-admin", "ops"),
            issue(root, "stranger", other, "tritond-admin", "ops"), live)
    p.serve()
    return p


def identity_repo(example_repo: Path, dest: Path) -> Path:
    shutil.copytree(example_repo / "identity_fp32", dest / "identity_fp32")
    return dest


def tls_args(pki: Pki, proto: str, mutual: bool) -> list[str]:
    args = [f"--{proto}-use-ssl-mutual=true" if mutual else f"--{proto}-use-ssl=true",
            f"--{proto}-server-cert={pki.live_cert}", f"--{proto}-server-key={pki.live_key}"]
    return args + [f"--{proto}-root-cert={pki.ca.cert}"] if mutual else args


def grpc_client(server: TritondServer, pki: Pki, who: Issued | None) -> grpcclient.InferenceServerClient:
    if who is None:
        return grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(pki.ca.cert))
    return grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(pki.ca.cert),
                                            private_key=str(who.key), certificate_chain=str(who.cert))


def http_client(server: TritondServer, pki: Pki, who: Issued | None) -> httpclient.InferenceServerClient:
    options = {"ca_certs": str(pki.ca.cert)}
    if who is not None:
        options.update(certfile=str(who.cert), keyfile=str(who.key))
    return httpclient.InferenceServerClient(server.http_url, ssl=True, ssl_options=options,
                                            ssl_context_factory=gevent.ssl.create_default_context)


def infer(client, module) -> np.ndarray:
    t = module.InferInput("INPUT0", [16], "FP32")
    t.set_data_from_numpy(X)
    return client.infer("identity_fp32", [t]).as_numpy("OUTPUT0")


def served_certificate(pki: Pki, port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            pki.context(pki.client).wrap_socket(raw, server_hostname="localhost") as tls:
        return tls.getpeercert(binary_form=True)


def der(issued: Issued) -> bytes:
    return ssl.PEM_cert_to_DER_cert(issued.cert.read_text())


# --------------------------------------------------------------------------- mutual TLS

@pytest.fixture(scope="module")
def mtls(pki, example_repo, tmp_path_factory):
    """gRPC and HTTP (uvicorn) under mutual TLS; repository APIs only for CN=tritond-admin
    (over HTTP also behind Triton's header scheme); metrics plain."""
    repo = identity_repo(example_repo, tmp_path_factory.mktemp("tls") / "models")
    openai_port = free_port()
    s = TritondServer(repo, tls_args(pki, "grpc", True) + tls_args(pki, "http", True) + [
        "--grpc-restricted-protocol-subject=model-repository:CN=tritond-admin",
        "--http-restricted-api-subject=model-repository:CN=tritond-admin,O=ops",
        "--http-restricted-api=model-repository:admin-key=secret",
        "--openai-port", str(openai_port),
    ], https=pki.context(pki.client))
    with serving(s):
        s.openai_port = openai_port
        yield s
        pki.serve()


def test_clients_with_a_certificate_infer(mtls, pki):
    assert np.array_equal(infer(grpc_client(mtls, pki, pki.client), grpcclient), X)
    assert np.array_equal(infer(http_client(mtls, pki, pki.client), httpclient), X)

    async def with_aio_clients() -> list[np.ndarray]:
        c = pki.client
        outputs = []
        for module, client in (
                (grpcclient, grpcaio.InferenceServerClient(mtls.grpc_url, ssl=True, root_certificates=str(pki.ca.cert),
                                                           private_key=str(c.key), certificate_chain=str(c.cert))),
                (httpclient, httpaio.InferenceServerClient(mtls.http_url, ssl=True, ssl_context=pki.context(c)))):
            t = module.InferInput("INPUT0", [16], "FP32")
            t.set_data_from_numpy(X)
            outputs.append((await client.infer("identity_fp32", [t])).as_numpy("OUTPUT0"))
            await client.close()
        return outputs

    assert all(np.array_equal(out, X) for out in asyncio.run(with_aio_clients()))


def test_large_tensors_over_tls(mtls, pki):
    """A 4 MiB binary body reaches the arena through the TLS transport (over HTTP, read there
    by a buffered protocol) and the output goes back from the worker's shared memory."""
    x = np.random.default_rng(0).random(1 << 20).astype(np.float32)
    for client, module in ((http_client(mtls, pki, pki.client), httpclient),
                           (grpc_client(mtls, pki, pki.client), grpcclient)):
        for _ in range(2):
            t = module.InferInput("INPUT0", [x.size], "FP32")
            t.set_data_from_numpy(x)
            assert np.array_equal(client.infer("identity_fp32", [t]).as_numpy("OUTPUT0"), x)
        client.close()


def test_clients_without_a_valid_certificate_are_refused(mtls, pki):
    for who in (None, pki.stranger):
        with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
            grpc_client(mtls, pki, who).is_server_live()
        with pytest.raises(REFUSED):
            http_client(mtls, pki, who).is_server_live()
    assert grpc_client(mtls, pki, pki.client).is_server_live()


def test_clear_text_clients_are_refused(mtls):
    with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
        grpcclient.InferenceServerClient(mtls.grpc_url).is_server_live()
    with pytest.raises(REFUSED):
        httpclient.InferenceServerClient(mtls.http_url).is_server_live()


def test_management_apis_restricted_to_a_certificate_subject(mtls, pki):
    with pytest.raises(InferenceServerException, match="PERMISSION_DENIED.*authorized certificate subject"):
        grpc_client(mtls, pki, pki.client).get_model_repository_index()
    assert grpc_client(mtls, pki, pki.admin).get_model_repository_index().models[0].name == "identity_fp32"
    # over HTTP both schemes at once: the subject and Triton's header
    user, admin = http_client(mtls, pki, pki.client), http_client(mtls, pki, pki.admin)
    key = {"admin-key": "secret"}
    with pytest.raises(InferenceServerException, match="authorized certificate subject"):
        user.get_model_repository_index(headers=key)
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        admin.get_model_repository_index()
    assert admin.get_model_repository_index(headers=key)[0]["name"] == "identity_fp32"
    assert np.array_equal(infer(user, httpclient), X)


def test_the_openai_port_keeps_https_restricted_apis(mtls, pki):
    """/v1/models is the repository's: the subject and header rules of HTTP hold there too."""
    def models(who: Issued, headers: dict[str, str]) -> tuple[int, dict]:
        conn = http.client.HTTPSConnection(mtls.http_url.split(":")[0], mtls.openai_port, context=pki.context(who),
                                           timeout=30)
        try:
            conn.request("GET", "/v1/models", headers=headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    key = {"admin-key": "secret"}
    status, body = models(pki.client, key)
    assert status == 403 and "authorized certificate subject" in body["error"]["message"]
    status, body = models(pki.admin, {})
    assert status == 403 and "expecting header 'admin-key'" in body["error"]["message"]
    status, body = models(pki.admin, key)
    assert status == 200 and [m["id"] for m in body["data"]] == ["identity_fp32"]


def test_metrics_port_stays_plain(mtls):
    status, body = http_get(f"http://127.0.0.1:{mtls.metrics_port}/metrics")
    assert status == 200 and b"nv_inference_request_success" in body


@pytest.mark.skipif(perf_analyzer() is None, reason="perf_analyzer is not installed")
def test_perf_analyzer_over_tls(mtls, pki):
    """perf_analyzer 2.48 (the one that runs here): --ssl-grpc-* with --ssl-grpc-use-ssl=true,
    and --ssl-https-* with an https:// URL (without the scheme it speaks clear text)."""
    base = [perf_analyzer(), "-m", "identity_fp32", "--shape", "INPUT0:16", "--request-count", "100"]
    grpc_ssl = ["-i", "grpc", "-u", mtls.grpc_url, "--ssl-grpc-use-ssl", "true",
                "--ssl-grpc-root-certifications-file", str(pki.ca.cert)]
    grpc_cert = ["--ssl-grpc-private-key-file", str(pki.client.key), "--ssl-grpc-certificate-chain-file",
                 str(pki.client.cert)]
    https = ["-i", "http", "-u", f"https://localhost:{mtls.http_port}", "--ssl-https-verify-peer", "1",
             "--ssl-https-verify-host", "2", "--ssl-https-ca-certificates-file", str(pki.ca.cert)]
    https_cert = ["--ssl-https-client-certificate-file", str(pki.client.cert), "--ssl-https-client-certificate-type",
                  "PEM", "--ssl-https-private-key-file", str(pki.client.key), "--ssl-https-private-key-type", "PEM"]
    for args in (grpc_ssl + grpc_cert, https + https_cert):
        out = subprocess.run(base + args, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert float(THROUGHPUT.findall(out.stdout)[0][1]) > 0, out.stdout
    for args in (grpc_ssl, https):   # no client certificate
        out = subprocess.run(base + args, capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "failed to get model metadata" in out.stdout + out.stderr


class Load:
    """Clients that keep inferring until stopped, each recording its failures: persistent
    gRPC and HTTP connections (requests in flight across a reload) and clients that connect
    anew for every request (so their handshakes meet each new certificate)."""

    def __init__(self, server: TritondServer, pki: Pki) -> None:
        self.server, self.pki = server, pki
        self.stop = threading.Event()
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": X.tolist()}]})
        self.body = body.encode()
        kinds = {"grpc": self.grpc_persistent, "http": self.http_persistent,
                 "grpc-new": self.grpc_new, "https-new": self.https_new}
        self.threads = [threading.Thread(target=self.loop, args=(f"{name}-{i}", fn))
                        for name, fn in kinds.items() for i in range(2 if name in ("grpc", "http") else 1)]

    def grpc_persistent(self, state: dict) -> None:
        client = state.setdefault("client", grpc_client(self.server, self.pki, self.pki.client))
        assert np.array_equal(infer(client, grpcclient), X)

    def http_persistent(self, state: dict) -> None:
        client = state.setdefault("client", http_client(self.server, self.pki, self.pki.client))
        assert np.array_equal(infer(client, httpclient), X)

    def grpc_new(self, state: dict) -> None:
        client = grpc_client(self.server, self.pki, self.pki.client)
        try:
            assert np.array_equal(infer(client, grpcclient), X)
        finally:
            client.close()

    def https_new(self, state: dict) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", self.server.http_port, timeout=30,
                                           context=state.setdefault("ctx", self.pki.context(self.pki.client)))
        try:
            conn.request("POST", "/v2/models/identity_fp32/infer", self.body)
            response = conn.getresponse()
            assert response.status == 200, response.read()
            response.read()
        finally:
            conn.close()

    def loop(self, name: str, step) -> None:
        state: dict = {}
        self.counts[name] = 0
        while not self.stop.is_set():
            try:
                step(state)
                self.counts[name] += 1
            except Exception as e:  # every failure is a lost request; the test reports them all
                self.errors.append(f"{name}: {type(e).__name__}: {e}")

    def serves_on(self, n: int = 3) -> None:
        """Wait until every load thread has completed `n` more requests."""
        before = dict(self.counts)
        wait_for(lambda: len(self.counts) == len(self.threads) and
                 all(c >= before.get(name, 0) + n for name, c in self.counts.items()), 30,
                 lambda: f"{n} more requests on every thread: {before} -> {self.counts}; errors {self.errors}")

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


@contextlib.contextmanager
def restored(pki: Pki):
    try:
        yield
    finally:
        pki.serve()


def wait_for_log(server: TritondServer, text: str, count: int, timeout: float = 20.0) -> None:
    wait_for(lambda: server.log.count(text) >= count, timeout, lambda: f"{count} x '{text}' in the log:\n{server.log}")


def test_sighup_rotation_under_load_loses_no_request(mtls, pki):
    """The broker gets the SIGHUPs too (it rescans the repository in poll mode only): it must not restart."""
    ports = (mtls.grpc_port, mtls.http_port)
    processes = sorted(mtls.pids())
    with Load(mtls, pki) as load, restored(pki):
        load.serves_on()
        for n, issued in enumerate((pki.next_server, pki.server, pki.next_server), start=1):
            pki.serve(issued)
            mtls.send_signal(signal.SIGHUP)
            for proto in ("gRPC", "HTTP"):
                wait_for_log(mtls, f"SIGHUP: {proto} now serves", n)
            assert [served_certificate(pki, p) for p in ports] == [der(issued)] * 2
            load.serves_on()
        before = dict(load.counts)
        pki.serve(pki.server, cert=b"not a certificate\n")
        mtls.send_signal(signal.SIGHUP)
        for proto in ("gRPC", "HTTP"):
            wait_for_log(mtls, f"SIGHUP: {proto} certificate not reloaded, the current one stays in use", 1)
        assert [served_certificate(pki, p) for p in ports] == [der(pki.next_server)] * 2
        load.serves_on()
    assert load.errors == []
    assert all(load.counts[name] > before[name] for name in before), load.counts
    assert sorted(mtls.pids()) == processes, "a process died or was restarted"


# --------------------------------------------------------------------------- TLS without client certificates

def test_tls_with_hypercorn_and_metrics_over_tls(pki, example_repo, tmp_path):
    """Server authentication only: clients need the CA, not a certificate. Hypercorn offers
    HTTP/2 through ALPN; --metrics-use-ssl puts the metrics port under the same certificate, and
    the OpenAI port is under it too."""
    repo = identity_repo(example_repo, tmp_path / "models")
    openai_port = free_port()
    s = TritondServer(repo, tls_args(pki, "grpc", False) + tls_args(pki, "http", False) + [
        "--http-server=hypercorn", "--metrics-use-ssl=true", f"--openai-port={openai_port}"], https=pki.context(None))
    with serving(s):
        status, body = http_get(f"https://localhost:{openai_port}/v1/models", context=pki.context(None))
        assert status == 200 and json.loads(body)["data"][0]["id"] == "identity_fp32"
        assert http_get(f"http://127.0.0.1:{openai_port}/v1/models")[0] != 200
        assert np.array_equal(infer(grpc_client(s, pki, None), grpcclient), X)
        assert np.array_equal(infer(http_client(s, pki, None), httpclient), X)
        status, body = http_get(f"https://localhost:{s.metrics_port}/metrics", context=pki.context(None))
        assert status == 200 and b"nv_inference_request_success" in body
        assert http_get(f"http://127.0.0.1:{s.metrics_port}/metrics")[0] != 200
        ctx = pki.context(None)
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        with socket.create_connection(("127.0.0.1", s.http_port)) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.selected_alpn_protocol() == "h2"
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
        with pytest.raises(REFUSED):
            httpclient.InferenceServerClient(s.http_url).is_server_live()


# --------------------------------------------------------------------------- bad files stop startup

def _bad_files(pki: Pki) -> dict[str, tuple[list[str], str]]:
    root = pki.root
    expired = issue(root, "expired", pki.ca, "localhost", server=True, not_before=-10 * DAY, not_after=-DAY)
    early = issue(root, "early", pki.ca, "localhost", server=True, not_before=DAY)
    locked = issue(root, "locked", pki.ca, "localhost", server=True, password=b"secret")
    old_ca = make_ca(root, "old-ca", "expired CA", not_after=-DAY)
    (root / "garbage.crt").write_text("this is not a certificate\n")
    missing = root / "missing.crt"

    def grpc(cert, key, root_cert=None):
        mutual = ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={root_cert}"] if root_cert else ["--grpc-use-ssl"]
        return mutual + [f"--grpc-server-cert={cert}", f"--grpc-server-key={key}"]

    def http(cert, key):
        return ["--http-use-ssl", f"--http-server-cert={cert}", f"--http-server-key={key}"]

    s = pki.server
    return {
        "missing": (grpc(missing, s.key), f"--grpc-server-cert {missing}: no such file"),
        "unreadable": (http(s.cert, root), f"--http-server-key {root}: cannot read it (Is a directory)"),
        "mismatched": (grpc(s.cert, pki.client.key), f"--grpc-server-key {pki.client.key} does not match the "
                                                      f"certificate in --grpc-server-cert {s.cert}"),
        "expired": (http(expired.cert, expired.key), "the certificate 'CN=localhost' expired on"),
        "not-yet-valid": (grpc(early.cert, early.key), "the certificate 'CN=localhost' is not valid before"),
        "expired-root": (grpc(s.cert, s.key, old_ca.cert), f"--grpc-root-cert {old_ca.cert}: the certificate "
                                                           f"'CN=expired CA' expired on"),
        "not-pem": (http(root / "garbage.crt", s.key), "no PEM certificate in it"),
        "encrypted-key": (grpc(locked.cert, locked.key), "the private key is encrypted"),
    }


BAD = ["missing", "unreadable", "mismatched", "expired", "not-yet-valid", "expired-root", "not-pem", "encrypted-key"]


@pytest.fixture(scope="module")
def bad_files(pki):
    return _bad_files(pki)


@pytest.mark.parametrize("case", BAD)
def test_a_bad_certificate_file_stops_startup(case, bad_files, example_repo):
    args, message = bad_files[case]
    s = TritondServer(example_repo, args).start(wait="exit")
    assert s.returncode == 1, s.log
    assert "cannot serve TLS: " in s.log and message in s.log, s.log
    assert "Started" not in s.log
    s.assert_clean()


def test_certificates_without_tls_are_a_usage_error(pki, example_repo):
    s = TritondServer(example_repo, [f"--grpc-server-cert={pki.server.cert}",
                                     f"--grpc-server-key={pki.server.key}"]).start(wait="exit")
    assert s.returncode == 1
    assert "given without --grpc-use-ssl=true; the port would serve clear text" in s.log
    s.assert_clean()
