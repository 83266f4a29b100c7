"""The pure parts of TLS: the flag rules, certificate checks, the server context's defaults,
the context swap a reload makes, and certificate-subject rules."""
from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading

import pytest

from conftest import ROOT
from tls_certs import DAY, issue, make_ca
from tritond.frontend.client_subject import SubjectRule, parse_name, subject_rules
from tritond.frontend.tls import SwappableContext, TlsError, TlsFiles, load, server_context
from tritond.options import UsageError, server_options, start_parser
from tritond.wire.options import ServerOptions, TlsConfig


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    ca = make_ca(root)
    return {"root": root, "ca": ca, "server": issue(root, "server", ca, "localhost", server=True),
            "next": issue(root, "next", ca, "localhost", server=True),
            "client": issue(root, "client", ca, "tritond-client", "tests")}


def options(*args: str) -> ServerOptions:
    return server_options(start_parser().parse_args(["--model-repository", "/m", *args]))


def files(pki, mutual: bool = False, **override) -> TlsFiles:
    paths = {"cert": str(pki["server"].cert), "key": str(pki["server"].key),
             "root": str(pki["ca"].cert) if mutual else None}
    paths.update(override)
    return TlsFiles("http", paths["cert"], paths["key"], paths["root"], mutual)


# --------------------------------------------------------------------------- flags

def test_tls_flags_follow_tritonserver(pki):
    cert, key, ca = str(pki["server"].cert), str(pki["server"].key), str(pki["ca"].cert)
    assert options().grpc_tls is None and options().http_tls is None
    tls = options("--grpc-use-ssl", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}").grpc_tls
    assert tls == TlsConfig(cert=cert, key=key, root=None, mutual=False)
    # --grpc-use-ssl-mutual alone turns TLS on, as in tritonserver
    tls = options("--grpc-use-ssl-mutual=true", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}",
                  f"--grpc-root-cert={ca}").grpc_tls
    assert tls.mutual and tls.root == ca
    # explicitly off: certificates unused, no error
    assert options("--http-use-ssl=false", f"--http-server-cert={cert}").http_tls is None
    # not served: nothing to check
    assert options("--allow-http=false", "--http-use-ssl", f"--http-server-cert={cert}",
                   f"--http-server-key={key}").http_tls is None


@pytest.mark.parametrize("args, message", [
    (["--grpc-server-cert=c", "--grpc-server-key=k"], "without --grpc-use-ssl=true; the port would serve clear text"),
    (["--http-root-cert=r"], "--http-root-cert given without --http-use-ssl=true"),
    (["--grpc-use-ssl"], "--grpc-use-ssl needs --grpc-server-cert, --grpc-server-key"),
    (["--http-use-ssl-mutual", "--http-server-cert=c", "--http-server-key=k"], "needs --http-root-cert"),
    (["--grpc-use-ssl=false", "--grpc-use-ssl-mutual=true"], "contradicts --grpc-use-ssl=false"),
    (["--metrics-use-ssl"], "--metrics-use-ssl uses the HTTP certificate settings"),
    (["--grpc-restricted-protocol-subject=model-repository:CN=a"], "needs --grpc-use-ssl-mutual=true"),
    (["--http-use-ssl", "--http-server-cert=c", "--http-server-key=k",
      "--http-restricted-api-subject=model-repository:CN=a"], "needs --http-use-ssl-mutual=true"),
    (["--http-use-ssl-mutual", "--http-server-cert=c", "--http-server-key=k", "--http-root-cert=r",
      "--http-server=hypercorn", "--http-restricted-api-subject=model-repository:CN=a"], "uvicorn only"),
    (["--grpc-restricted-protocol-subject=model_repository:CN=a"], "unknown restricted api"),
    (["--grpc-restricted-protocol-subject=model-repository"], "expected <categories>:<name>"),
    (["--grpc-restricted-protocol-subject=model-repository:admin"], "is not an RFC 4514 name"),
])
def test_tls_flag_mistakes_are_usage_errors(args, message):
    with pytest.raises(UsageError, match=message):
        options(*args)


def test_subject_restrictions_collect_names_per_category(pki):
    cert, key, ca = str(pki["server"].cert), str(pki["server"].key), str(pki["ca"].cert)
    opts = options("--grpc-use-ssl-mutual", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}",
                   f"--grpc-root-cert={ca}",
                   "--grpc-restricted-protocol-subject=model-repository,shared-memory:CN=ops",
                   "--grpc-restricted-protocol-subject=model-repository:CN=backup,O=Example")
    assert opts.grpc_restricted_subjects == {"model-repository": ["CN=ops", "CN=backup,O=Example"],
                                                "shared-memory": ["CN=ops"]}


# --------------------------------------------------------------------------- certificate checks

def test_load_checks_the_pair_and_the_root(pki):
    material = load(files(pki, mutual=True))
    assert material.subject == "CN=localhost"
    assert material.root_pem == pki["ca"].cert.read_bytes()
    with pytest.raises(TlsError, match="does not match the certificate"):
        load(files(pki, key=str(pki["client"].key)))
    with pytest.raises(TlsError, match="expired on"):
        load(files(pki), now=pki["server"].certificate.not_valid_after_utc + DAY)


def test_server_context_has_modern_defaults_only(pki):
    ctx = server_context(load(files(pki, mutual=True)))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.options & ssl.OP_NO_COMPRESSION and ctx.options & ssl.OP_NO_RENEGOTIATION
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert server_context(load(files(pki))).verify_mode == ssl.CERT_NONE


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> tuple[bytes, str | None]:
    """One loopback handshake: the certificate the server presented, and the server's error
    (None when it accepted the client)."""
    outcome: list[str | None] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def accept():
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"x")
                outcome.append(None)
            except ssl.SSLError as e:
                outcome.append(e.reason)
                conn.close()
        t = threading.Thread(target=accept)
        t.start()
        with socket.create_connection(listener.getsockname()) as raw, \
                client_ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            cert = tls.getpeercert(binary_form=True)
            try:
                tls.recv(1)
            except (ssl.SSLError, OSError):
                pass
        t.join(10)
    return cert, outcome[0]


def test_a_swapped_context_serves_new_handshakes(pki):
    client = ssl.create_default_context(cafile=str(pki["ca"].cert))
    served = SwappableContext(load(files(pki)))
    first, _ = handshake(served.context, client)
    served.use(served.build(load(files(pki, cert=str(pki["next"].cert), key=str(pki["next"].key)))))
    second, _ = handshake(served.context, client)
    assert first == ssl.PEM_cert_to_DER_cert(pki["server"].cert.read_text())
    assert second == ssl.PEM_cert_to_DER_cert(pki["next"].cert.read_text())


def test_a_swapped_context_verifies_clients_against_the_new_root(pki, tmp_path):
    new_ca = make_ca(tmp_path, "new-ca", "new CA")
    newcomer = issue(tmp_path, "newcomer", new_ca, "newcomer")
    client = ssl.create_default_context(cafile=str(pki["ca"].cert))
    client.load_cert_chain(str(newcomer.cert), str(newcomer.key))
    served = SwappableContext(load(files(pki, mutual=True)))
    assert handshake(served.context, client)[1] == "CERTIFICATE_VERIFY_FAILED"
    served.use(served.build(load(files(pki, mutual=True, root=str(new_ca.cert)))))
    assert handshake(served.context, client)[1] is None


# --------------------------------------------------------------------------- subjects

def test_a_subject_rule_needs_every_attribute(pki):
    client_der = ssl.PEM_cert_to_DER_cert(pki["client"].cert.read_text())   # CN=tritond-client, O=tests
    assert SubjectRule((parse_name("CN=tritond-client"),)).admits(client_der)
    assert SubjectRule((parse_name("O=tests,CN=tritond-client"),)).admits(pki["client"].cert.read_bytes())
    assert not SubjectRule((parse_name("CN=tritond-client,O=ops"),)).admits(client_der)
    assert SubjectRule((parse_name("CN=x"), parse_name("O=tests"))).admits(client_der)
    assert not SubjectRule((parse_name("CN=tritond-client"),)).admits(None)
    assert subject_rules({"statistics": ["CN=a"]})["statistics"].names == (parse_name("CN=a"),)
    with pytest.raises(ValueError):
        parse_name("tritond-client")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_throwaway_certificate_script_makes_a_usable_set(tmp_path):
    subprocess.run(["bash", str(ROOT / "scripts" / "make-tls-certs.sh"), str(tmp_path)], check=True,
                   capture_output=True, timeout=60)
    made = {p.name for p in tmp_path.iterdir()}
    assert made == {f"{n}.{ext}" for n in ("ca", "server", "client", "admin") for ext in ("crt", "key")}
    assert load(TlsFiles("grpc", str(tmp_path / "server.crt"), str(tmp_path / "server.key"),
                         str(tmp_path / "ca.crt"), True)).subject == "CN=localhost"
    admin = (tmp_path / "admin.crt").read_bytes()
    assert SubjectRule((parse_name("CN=tritond-admin,O=ops"),)).admits(admin)
    assert not SubjectRule((parse_name("CN=tritond-admin"),)).admits((tmp_path / "client.crt").read_bytes())
