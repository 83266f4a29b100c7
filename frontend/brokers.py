"""A frontend's connections to a server's several brokers (--broker-shards), as one client.

Each broker schedules its own group of models and publishes its own table; a request goes
straight to its model's broker, so no broker relays another's traffic. Control operations go
to the first broker, which answers for all (broker/shards/fanout.py); a load or unload is
followed by a round trip to each other broker, so the table it produced is here when the
caller hears it succeeded. Request ids carry the broker in their low digits, so a reply's
outputs are released where they came from, and trace ids carry it in their high bits
(wire.schema.TRACE_SHARD_SHIFT).
"""
from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable

from tritond.wire import schema as S
from tritond.wire.addresses import Addresses

from .broker_client import BrokerClient, ModelTable, ReplyStream


class Brokers:
    def __init__(self, run_dir: str, kind: str, shards: int) -> None:
        self.clients = [BrokerClient(Addresses(run_dir, k).frontends, kind) for k in range(shards)]
        self.first = self.clients[0]
        self.shards = shards
        self.ids = itertools.count(1)
        self.route: dict[str, int] = {}     # model name -> its broker
        self.table = ModelTable()
        self.serving = True
        self._tables: list[S.Table | None] = [None] * shards   # each broker's last (kept while it restarts)
        for k, client in enumerate(self.clients):
            client.on_table = lambda k=k: self._merge(k)

    def _merge(self, k: int) -> None:
        self._tables[k] = self.clients[k].table.table
        tables = [t for t in self._tables if t is not None]
        route = {name: k for k, t in enumerate(self._tables) if t is not None
                 for name in [*t.names, *(e.name for e in t.models)]}     # a model loaded from file overrides alone
        complete = len(tables) == self.shards
        self.route = route
        self.table = ModelTable(S.Table(
            sum(t.epoch for t in tables), [e for t in tables for e in t.models], sorted(route),
            complete and all(t.startup_done for t in tables), any(t.stopping for t in tables)))

    async def start(self) -> None:
        for client in self.clients:
            await client.start()

    async def wait_table(self, timeout: float) -> bool:
        results = await asyncio.gather(*(c.wait_table(timeout) for c in self.clients))
        return all(results)

    @property
    def alive(self) -> bool:
        return all(c.alive for c in self.clients)

    @property
    def tracing(self) -> bool:
        return any(c.tracing for c in self.clients)

    def trace_mode(self, model: str) -> str:
        return self.clients[self.route.get(model, 0)].trace_mode(model)

    def ready(self, strict: bool, paged: bool = False) -> bool:
        return self.serving and self.alive and self.table.ready(strict, paged)

    def next_id(self, model: str = "") -> int:
        return next(self.ids) * self.shards + self.route.get(model, 0)

    def _client(self, rid: int) -> BrokerClient:
        return self.clients[rid % self.shards]

    async def infer(self, msg: S.Infer, on_orphan: Callable[[], None] | None = None) -> S.InferReply:
        return await self._client(msg.rid).infer(msg, on_orphan)

    def after_cancel(self, rid: int, traced: Callable[[S.InferReply], None]) -> None:
        self._client(rid).after_cancel(rid, traced)

    def open_stream(self, msg: S.Infer) -> ReplyStream:
        return self._client(msg.rid).open_stream(msg)

    def release_outputs(self, reply: S.InferReply) -> None:
        self._client(reply.rid).release_outputs(reply)

    async def model_ready(self, entry: S.ModelEntry) -> bool:
        """Asked of the model's own broker."""
        return await self.clients[self.route.get(entry.name, 0)].model_ready(entry)

    async def control(self, op: S.ControlOp, timeout: float = 600.0) -> Any:
        result = await self.first.control(op, timeout)
        if isinstance(op, (S.LoadModel, S.UnloadModel)):
            # The broker that loaded the model published its table on its own connection before
            # it answered; a round trip on each connection makes sure this process has it.
            await asyncio.gather(*(c.control(S.LogSettings({}), timeout) for c in self.clients[1:] if c.alive),
                                 return_exceptions=True)
        return result

    def send_quietly(self, msg: S.TraceDone) -> None:
        k = msg.id >> S.TRACE_SHARD_SHIFT
        if k < self.shards:
            self.clients[k].send_quietly(msg)

    @property
    def on_gone(self) -> Callable[[str], None] | None:
        return self.first.on_gone

    @on_gone.setter
    def on_gone(self, fn: Callable[[str], None] | None) -> None:
        for client in self.clients:
            client.on_gone = fn

    def close(self) -> None:
        for client in self.clients:
            client.close()
