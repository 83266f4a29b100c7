"""Entry point of a gRPC frontend process (grpc.aio on uvloop).

`python -m tritond.frontend.grpc.server <options-json>`. Several of these may listen on one
port (SO_REUSEPORT). SIGTERM stops new RPCs (UNAVAILABLE), lets in-flight ones finish
within the exit timeout, then closes the server. With TLS, SIGHUP reloads the certificates;
gRPC asks for the newest configuration before each new connection's handshake.
"""
from __future__ import annotations

import gc
import logging
import sys
import threading

import grpc
import uvloop

from tritond.shm.heap import keep_large_allocations
from tritond.wire.options import ServerOptions

from ..client_subject import subject_rules
from ..metadata import server_extensions
from ..process import frontend_dataplane, start_process
from ..tls import Reloader, TlsError, TlsFiles, TlsMaterial, load
from .health import health_handler
from .parsing import add_servicer
from .servicer import GrpcOptions, InferenceServicer

log = logging.getLogger("tritond.grpc")

MAX_MESSAGE = (1 << 31) - 1
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.so_reuseport", 1),
]
# Streams left open by clients are cut this long after in-flight work has drained.
STOP_GRACE_S = 2.0


def bind_address(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{port}"


def certificate_configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(material.key_pem, material.cert_pem)],
                                                     root_certificates=material.root_pem)


class Credentials:
    """Server credentials whose certificates can be replaced: gRPC calls `fetch` (from one of
    its own threads) before each new connection's handshake, and takes a configuration it
    returns as the one to use from then on; open connections keep theirs."""

    def __init__(self, material: TlsMaterial) -> None:
        self.files = material.files
        self.initial = certificate_configuration(material)
        self.pending: grpc.ServerCertificateConfiguration | None = None
        self.lock = threading.Lock()

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self.initial, self.fetch,
                                                   require_client_authentication=self.files.mutual)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self.lock:
            pending, self.pending = self.pending, None
        return pending

    def use(self, configuration: grpc.ServerCertificateConfiguration) -> None:
        with self.lock:
            self.pending = configuration

    def reloader(self) -> Reloader:
        return Reloader(self.files, certificate_configuration, self.use)


async def run(opts: ServerOptions) -> None:
    files = TlsFiles.from_options("grpc", opts.grpc_tls)
    credentials = Credentials(load(files)) if files else None
    reload = credentials.reloader().reload if credentials else None
    async with frontend_dataplane(opts, "grpc", reload) as (dataplane, stop, listening):
        servicer = InferenceServicer(dataplane, GrpcOptions(
            server_name=opts.server_name,
            strict_readiness=opts.strict_readiness,
            extensions=server_extensions(opts),
            restricted=opts.grpc_restricted,
            subjects=subject_rules(opts.grpc_restricted_subjects),
            init_failed=bool(opts.init_failed),
            paged=opts.model_control_mode == "paged",
            header_forward=opts.grpc_header_forward,
        ))
        limits = list(opts.grpc_channel_args)   # keepalive, streams
        server = grpc.aio.server(options=SERVER_OPTIONS + limits)
        add_servicer(servicer, server)
        server.add_generic_rpc_handlers((health_handler(servicer),))
        address = bind_address(opts.grpc_address, opts.grpc_port)
        if credentials is not None:
            server.add_secure_port(address, credentials.server_credentials())
        else:
            server.add_insecure_port(address)
        await server.start()
        gc.freeze()         # what startup made lives as long as the process: collections skip it
        listening()
        await stop.wait()
        await servicer.drain(opts.exit_timeout_secs)
        await server.stop(STOP_GRACE_S)


def main(argv: list[str]) -> int:
    opts = start_process(argv, "grpc")
    keep_large_allocations()
    try:
        uvloop.run(run(opts))
    except TlsError as e:
        log.error("gRPC frontend cannot serve TLS: %s", e)
        return 1
    except RuntimeError as e:
        log.error("gRPC frontend failed: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
