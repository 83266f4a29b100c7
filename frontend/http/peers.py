"""Which client certificate each open TLS connection presented, for APIs restricted to a
certificate subject. Neither uvicorn nor hypercorn puts the peer certificate into the ASGI
scope, so the uvicorn protocol class is extended to record it when a connection is made
(after the handshake) under the peer address, which uvicorn puts in the scope as "client".
That address must be the socket's own: uvicorn's proxy-header rewriting stays off."""
from __future__ import annotations

import asyncio
from typing import Any


def _peer(transport: asyncio.BaseTransport) -> tuple[str, int] | None:
    """The peer address as uvicorn writes scope["client"]."""
    info = transport.get_extra_info("peername")
    return (str(info[0]), int(info[1])) if isinstance(info, tuple) else None


class PeerCertificates:
    def __init__(self) -> None:
        self._by_peer: dict[tuple[str, int], tuple[object, bytes]] = {}

    def protocol(self, base: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
        """`base` (uvicorn's HTTP protocol class), recording each connection's certificate."""
        table = self._by_peer

        class Recorded(base):   # type: ignore[misc, valid-type]
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self._tritond_peer = _peer(transport)
                ssl_object = transport.get_extra_info("ssl_object")
                if self._tritond_peer is not None and ssl_object is not None:
                    table[self._tritond_peer] = (self, ssl_object.getpeercert(binary_form=True) or b"")
                super().connection_made(transport)

            def connection_lost(self, exc: Exception | None) -> None:
                entry = table.get(self._tritond_peer)
                if entry is not None and entry[0] is self:
                    del table[self._tritond_peer]
                super().connection_lost(exc)

        return Recorded

    def certificate(self, scope: dict[str, Any]) -> bytes | None:
        """The DER certificate the client of this request presented, if any."""
        client = scope.get("client")
        entry = self._by_peer.get(tuple(client)) if client else None
        return entry[1] if entry else None
