"""Throw-away certificates for the TLS tests, made with `cryptography` (never checked in)."""
from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = dt.timedelta(days=1)


@dataclass
class Issued:
    cert: Path
    key: Path
    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _write(dest: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey,
           password: bytes | None = None) -> Issued:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    (dest / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (dest / f"{stem}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         encryption))
    return Issued(dest / f"{stem}.crt", dest / f"{stem}.key", cert, key)


def make_ca(dest: Path, stem: str = "ca", common_name: str = "tritond test CA",
            not_after: dt.timedelta = 30 * DAY) -> Issued:
    now = dt.datetime.now(dt.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY).not_valid_after(now + not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return _write(dest, stem, cert, key)


def issue(dest: Path, stem: str, ca: Issued, common_name: str, organization: str | None = None,
          server: bool = False, not_before: dt.timedelta = -DAY, not_after: dt.timedelta = 30 * DAY,
          password: bytes | None = None) -> Issued:
    """A leaf certificate signed by `ca`: a server one names localhost and 127.0.0.1."""
    now = dt.datetime.now(dt.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(_name(common_name, organization))
               .issuer_name(ca.certificate.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now + not_before).not_valid_after(now + not_after)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                     else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return _write(dest, stem, builder.sign(ca.private_key, hashes.SHA256()), key, password)
