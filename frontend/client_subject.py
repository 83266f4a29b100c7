"""Restricted APIs by client certificate: under mutual TLS an API category can be limited to
clients whose verified certificate subject carries given attributes. A rule is written as an
RFC 4514 name ("CN=ops-admin" or "CN=ops,O=Example"); a subject matches when it has every
attribute of the rule with exactly that value, and a category with several rules admits a
client that matches any of them."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from cryptography import x509

Attribute = tuple[str, str]   # (dotted OID, value)


def parse_name(text: str) -> frozenset[Attribute]:
    """The attributes of an RFC 4514 name; ValueError when it is not one."""
    try:
        name = x509.Name.from_rfc4514_string(text)
    except ValueError as e:
        raise ValueError(f"'{text}' is not an RFC 4514 name such as CN=admin,O=Example ({e})") from None
    attributes = frozenset((a.oid.dotted_string, str(a.value)) for a in name)
    if not attributes:
        raise ValueError(f"'{text}' names no attribute")
    return attributes


@functools.lru_cache(maxsize=256)
def subject_of(certificate: bytes) -> frozenset[Attribute]:
    """The subject attributes of a DER or PEM certificate (cached: clients reuse theirs)."""
    if certificate.startswith(b"-----"):
        cert = x509.load_pem_x509_certificate(certificate)
    else:
        cert = x509.load_der_x509_certificate(certificate)
    return frozenset((a.oid.dotted_string, str(a.value)) for a in cert.subject)


@dataclass(frozen=True)
class SubjectRule:
    names: tuple[frozenset[Attribute], ...]

    def admits(self, certificate: bytes | None) -> bool:
        """True when the client's certificate (already verified by the TLS layer) matches."""
        if not certificate:
            return False
        subject = subject_of(certificate)
        return any(name <= subject for name in self.names)


def subject_rules(specs: dict[str, list[str]] | None) -> dict[str, SubjectRule]:
    """{category: [name, ...]} as the options carry it -> {category: SubjectRule}."""
    return {cat: SubjectRule(tuple(parse_name(n) for n in names)) for cat, names in (specs or {}).items()}
