"""Requests of decoupled models, from dispatch until their final response.

A decoupled model answers a request with 0..N responses, sent by the worker as `Respond`
messages while (or after) execute() runs; each is forwarded to the requester at once as an
InferReply with `more` set, the last without. A worker's BatchDone only frees its instance.
The requester bounds how many replies it buffers (`Infer.window`); its Credits are forwarded to
the worker's heartbeat thread, which lets the model's sender go on.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tritond.wire.schema import Grant, InferReply, Release, Respond, heartbeat_identity, lease_of

from tritond.broker.tables.inflight import Req
from tritond.broker.supervision.pool import Instance


class Streams:
    def __init__(self, send_worker: Callable[[bytes, Any], None], route_release: Callable[[Release], None],
                 now_ns: Callable[[], int]) -> None:
        self._send_worker = send_worker
        self._now_ns = now_ns
        self._route_release = route_release
        self.open: dict[int, Req] = {}

    def add(self, req: Req) -> None:
        self.open[req.key] = req

    def discard(self, key: int) -> None:
        self.open.pop(key, None)

    def on_respond(self, inst: Instance, msg: Respond,
                   finish: Callable[[Req, InferReply, bool], None]) -> None:
        """A response from the worker: forward it, and on the final one answer the request."""
        req = self.open.get(msg.key)
        if req is None or req.worker != inst.identity:
            # The request was already answered (its worker was replaced, it failed): nobody
            # will read these outputs.
            leases = sorted({lease_of(d) for d in msg.outputs} - {0})
            if leases:
                self._route_release(Release(inst.identity, leases))
            return
        if not req.responded:           # the first-response histogram times the first one only
            req.responded = True
            if req.mv.stats.latency is not None:
                req.mv.stats.latency.first_response_ms((self._now_ns() - req.arrival_ns) // 1_000_000)
        reply = InferReply(req.msg.rid, req.mv.version, msg.outputs, msg.error, inst.identity,
                           more=not msg.final, empty=msg.empty, parameters=msg.parameters)
        if msg.final:
            del self.open[msg.key]
            finish(req, reply, msg.error is None)
        else:
            req.reply(reply)

    def credit(self, req: Req, n: int) -> None:
        if req.key in self.open and n > 0:
            self._send_worker(heartbeat_identity(req.worker), Grant(req.key, n))

    def lost(self, inst: Instance) -> list[Req]:
        """The open requests of a worker that died (the caller fails them)."""
        return [r for r in self.open.values() if r.worker == inst.identity]

