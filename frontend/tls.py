"""Certificates for the TLS ports: read and checked in one place, so that a missing,
unreadable, mismatched or expired file stops startup (or a SIGHUP reload) with a message
that names the flag and the file, instead of failing later in every client's handshake.

The supervisor checks the files before it starts anything; each frontend loads them again
when it starts and on every SIGHUP. An HTTP port keeps one `SwappableContext` for its whole
life: a reload builds a new context beside it and later handshakes move onto that one, so
open connections and the requests on them are never touched.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import ssl
from dataclasses import dataclass
from typing import Callable, Iterator

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from tritond.wire.options import TlsConfig

log = logging.getLogger("tritond.tls")


class TlsError(ValueError):
    """A certificate or key that cannot be served; the message names the flag and the file."""


@dataclass(frozen=True)
class TlsFiles:
    """One protocol's TLS settings as given on the command line."""

    flag: str            # "grpc" | "http": the flags are --<flag>-server-cert and so on
    cert: str
    key: str
    root: str | None     # root certificates that client certificates must chain to
    mutual: bool         # require and verify a client certificate

    @classmethod
    def from_options(cls, flag: str, spec: TlsConfig | None) -> "TlsFiles | None":
        if spec is None:
            return None
        return cls(flag, spec.cert, spec.key, spec.root, spec.mutual)

    @property
    def protocol(self) -> str:
        return {"grpc": "gRPC", "http": "HTTP"}.get(self.flag, self.flag)

    def option(self, which: str) -> str:
        return f"--{self.flag}-{which}"


@dataclass(frozen=True)
class TlsMaterial:
    """The checked contents of a TlsFiles."""

    files: TlsFiles
    cert_pem: bytes
    key_pem: bytes
    root_pem: bytes | None
    subject: str
    not_after: dt.datetime

    def describe(self) -> str:
        return f"certificate '{self.subject}' valid until {self.not_after:%Y-%m-%d %H:%M} UTC"


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise TlsError(f"{option} {path}: no such file") from None
    except OSError as e:
        raise TlsError(f"{option} {path}: cannot read it ({e.strerror})") from None


def _certificates(data: bytes, path: str, option: str, now: dt.datetime) -> list[x509.Certificate]:
    """Every certificate in a PEM file, each one currently valid."""
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TlsError(f"{option} {path}: no PEM certificate in it") from None
    for cert in certs:
        subject = cert.subject.rfc4514_string()
        if cert.not_valid_after_utc < now:
            raise TlsError(f"{option} {path}: the certificate '{subject}' expired on "
                           f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if cert.not_valid_before_utc > now:
            raise TlsError(f"{option} {path}: the certificate '{subject}' is not valid before "
                           f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    return certs


def _private_key(data: bytes, path: str, option: str):
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TlsError(f"{option} {path}: the private key is encrypted; give an unencrypted key "
                       f"and protect the file by its permissions") from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsError(f"{option} {path}: no usable PEM private key in it") from None


def _public_der(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def load(files: TlsFiles, now: dt.datetime | None = None) -> TlsMaterial:
    """Read and check the files: certificates parse and are within their validity period,
    the key is unencrypted and belongs to the first certificate of the chain."""
    now = now or dt.datetime.now(dt.timezone.utc)
    cert_opt, key_opt, root_opt = files.option("server-cert"), files.option("server-key"), files.option("root-cert")
    cert_pem = _read(files.cert, cert_opt)
    key_pem = _read(files.key, key_opt)
    root_pem = _read(files.root, root_opt) if files.root else None
    leaf = _certificates(cert_pem, files.cert, cert_opt, now)[0]
    key = _private_key(key_pem, files.key, key_opt)
    if _public_der(key.public_key()) != _public_der(leaf.public_key()):
        raise TlsError(f"{key_opt} {files.key} does not match the certificate in {cert_opt} {files.cert}")
    if root_pem is not None:
        _certificates(root_pem, files.root, root_opt, now)
    return TlsMaterial(files, cert_pem, key_pem, root_pem, leaf.subject.rfc4514_string(), leaf.not_valid_after_utc)


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path to `data` that exists only in memory: the ssl module loads certificates and
    keys from paths only, and the bytes loaded must be the bytes that were checked."""
    fd = os.memfd_create("tritond-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _no_password() -> bytes:
    raise TlsError("encrypted private keys are not supported")


def server_context(material: TlsMaterial, alpn: list[str] | None = None) -> ssl.SSLContext:
    """A server context with modern defaults only: TLS 1.2 or newer, no compression, no
    renegotiation, OpenSSL's default (forward-secret, AEAD) cipher list."""
    files = material.files
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    try:
        with _memory_file(material.cert_pem) as cert, _memory_file(material.key_pem) as key:
            ctx.load_cert_chain(cert, key, password=_no_password)
        if files.mutual:
            ctx.verify_mode = ssl.CERT_REQUIRED
            with _memory_file(material.root_pem or b"") as root:
                ctx.load_verify_locations(cafile=root)
    except ssl.SSLError as e:
        raise TlsError(f"{files.option('server-cert')} {files.cert}: OpenSSL refuses it ({e.reason or e})") from None
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


class SwappableContext:
    """The SSLContext handed to an HTTP server once. Its SNI callback (which OpenSSL calls on
    every handshake, with or without a server name) moves each new connection onto the newest
    context, so a new certificate applies to new connections while open ones keep theirs."""

    def __init__(self, material: TlsMaterial, alpn: list[str] | None = None) -> None:
        self.alpn = alpn
        self.context = server_context(material, alpn)
        self.current = self.context
        self.context.sni_callback = self._select

    def _select(self, ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        if self.current is not context:
            ssl_object.context = self.current

    def build(self, material: TlsMaterial) -> ssl.SSLContext:
        return server_context(material, self.alpn)

    def use(self, context: ssl.SSLContext) -> None:
        self.current = context


class Reloader:
    """Reloads one protocol's certificates on SIGHUP: `prepare` turns checked material into
    something ready to switch to (it may raise TlsError), `switch` makes it current. A file
    that fails a check leaves the certificate in use as it was."""

    def __init__(self, files: TlsFiles, prepare: Callable[[TlsMaterial], object],
                 switch: Callable[[object], None]) -> None:
        self.files = files
        self.prepare = prepare
        self.switch = switch

    def reload(self) -> bool:
        try:
            material = load(self.files)
            ready = self.prepare(material)
        except TlsError as e:
            log.error("SIGHUP: %s certificate not reloaded, the current one stays in use: %s",
                      self.files.protocol, e)
            return False
        self.switch(ready)
        log.info("SIGHUP: %s now serves %s from %s", self.files.protocol, material.describe(), self.files.cert)
        return True
