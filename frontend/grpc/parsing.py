"""Registering the servicer so that a request message that does not parse is the client's
error (INVALID_ARGUMENT) rather than an exception inside grpc, which answers UNKNOWN with
the Python exception's class in the text.

The generated `add_GRPCInferenceServiceServicer_to_server` is run against a recorder; its
handlers are registered again with deserializers that return `UNPARSED` instead of raising,
and the handlers (servicer.py) answer that with INVALID_ARGUMENT. ModelInfer is registered
without a deserializer and serializer: its handler takes the request's bytes and returns the
response's (it parses and encodes them itself, once); ModelStreamInfer writes its responses as
bytes it encoded.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2_grpc

SERVICE = "inference.GRPCInferenceService"
RAW = ("ModelInfer",)     # RPCs whose handlers take and return bytes
RAW_RESPONSES = ("ModelStreamInfer",)   # RPCs whose handlers write bytes
UNPARSABLE = "the request message could not be parsed as a protobuf message of the RPC's type"


class _Unparsed:
    """Stands for a request message that did not parse."""
    __slots__ = ()
    id = ""
    model_name = ""
    model_version = ""


UNPARSED = _Unparsed()


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:   # DecodeError, and whatever else protobuf raises on hostile bytes
            return UNPARSED
    return deserialize


class _Recorder:
    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers = dict(handlers)


def add_servicer(servicer: Any, server: grpc.aio.Server) -> None:
    recorder = _Recorder()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, recorder)
    handlers = {}
    for name, h in recorder.handlers.items():
        if name in RAW:
            handlers[name] = h._replace(request_deserializer=None, response_serializer=None)
        else:
            handlers[name] = h._replace(request_deserializer=_tolerant(h.request_deserializer),
                                        response_serializer=None if name in RAW_RESPONSES else h.response_serializer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
