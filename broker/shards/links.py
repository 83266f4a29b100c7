"""A broker's links to the server's other brokers (--broker-shards).

Every broker holds a DEALER to each other broker's frontend socket and says hello on it as a
peer of kind "broker", so each learns the others' model tables (which broker schedules which
model). Over a link go a model's BLS calls to a model another broker schedules (the reply
comes back to the calling worker as if served here; its outputs are released, and its
cancellation sent, back over the same link), and the first broker's control operations.
"""
from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from tritond.wire import schema as S
from tritond.wire.addresses import Addresses
from tritond.wire.errors import unavailable
from tritond.wire.options import ServerOptions

log = logging.getLogger("tritond.broker")

HELLO_EVERY_S = 0.2

Answer = Callable[..., None]    # answer(result) or answer(error=TritonError)


@dataclass(eq=False)
class Link:
    index: int
    sock: zmq.Socket
    table: S.Table | None = None    # its last model table (kept while it restarts)
    boot: int = 0                   # its pid as its messages say: a new one is a new process
    heard: float = 0.0
    alive: bool = False             # it answered the current hello
    next_hello: float = 0.0


@dataclass(eq=False)
class Forwarded:
    """A BLS call sent to another broker: who called, under which id, and where it went."""
    caller: bytes
    rid: int
    link: int


class PeerLinks:
    def __init__(self, opts: ServerOptions, ctx: zmq.Context, now: Callable[[], float],
                 to_worker: Callable[[bytes, S.InferReply], None], is_worker: Callable[[bytes], bool],
                 changed: Callable[[], None]) -> None:
        self.now = now
        self.to_worker = to_worker
        self.is_worker = is_worker
        self.changed = changed              # a table arrived
        self.on_restart: Callable[[Link], None] | None = None    # a new process behind a link
        self.links: dict[int, Link] = {}
        for k in range(opts.broker_shards):
            if k != opts.shard:
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.MAXMSGSIZE, S.MAX_FRAME)
                sock.setsockopt(zmq.SNDHWM, 0)
                sock.setsockopt(zmq.RCVHWM, 0)
                sock.connect(Addresses(opts.run_dir, k).frontends)
                self.links[k] = Link(k, sock, heard=now())
        self.by_sock = {link.sock: link for link in self.links.values()}
        self.decoder = S.decoder(S.BrokerToFrontend)
        self.ids = itertools.count(1)
        self.pending: dict[int, tuple[int, Answer]] = {}     # control id -> (link, answer)
        self.forwarded: dict[int, Forwarded] = {}            # request id on the link -> the call
        self.by_caller: dict[tuple[bytes, int], int] = {}    # (caller, its id) -> request id on the link

    def sockets(self) -> list[zmq.Socket]:
        return list(self.by_sock)

    def tick(self, now: float) -> float:
        """Repeat the hello on every link not answered yet; seconds until the next one."""
        wait = 1.0
        for link in self.links.values():
            if not link.alive:
                if now >= link.next_hello:
                    link.next_hello = now + HELLO_EVERY_S
                    self._send(link, S.Hello(S.PROTOCOL_VERSION, "broker", os.getpid()))
                wait = min(wait, max(0.0, link.next_hello - now))
        return wait

    def lost(self, index: int) -> None:
        """The broker behind a link died: what it owed fails now; the hello starts over."""
        link = self.links[index]
        link.alive = False
        self._fail(link, f"broker {index} died before it answered; retry shortly")

    # ---------------------------------------------------------------- receiving

    def receive(self, sock: zmq.Socket) -> None:
        link = self.by_sock[sock]
        while sock.poll(0):
            try:
                msg = self.decoder.decode(sock.recv(zmq.NOBLOCK))
            except (zmq.Again, S.DecodeError):
                return
            link.heard = self.now()
            if isinstance(msg, S.InferReply):
                self._reply(msg)
            elif isinstance(msg, S.Replies):
                for reply in msg.replies:
                    self._reply(reply)
            elif isinstance(msg, S.Table):
                self._note_boot(link, msg.boot)
                link.alive = True
                link.table = msg
                self.changed()
            elif isinstance(msg, S.Ping):
                self._note_boot(link, msg.boot)
            elif isinstance(msg, S.ControlReply):
                entry = self.pending.pop(msg.cid, None)
                if entry is not None:
                    entry[1](msg.result, error=msg.error)
            elif isinstance(msg, S.Refused):
                log.error("broker %d refused this one: %s", link.index, msg.reason)

    def _note_boot(self, link: Link, boot: int) -> None:
        if boot and boot != link.boot:
            if link.boot:
                self._fail(link, f"broker {link.index} was restarted before it answered; retry shortly")
            link.boot = boot
            if self.on_restart is not None:
                self.on_restart(link)

    def _fail(self, link: Link, why: str) -> None:
        err = unavailable(why)
        for cid in [c for c, (k, _) in self.pending.items() if k == link.index]:
            self.pending.pop(cid)[1](None, error=err)
        for rid in [r for r, f in self.forwarded.items() if f.link == link.index]:
            call = self.forwarded.pop(rid)
            self.by_caller.pop((call.caller, call.rid), None)
            if self.is_worker(call.caller):
                self.to_worker(call.caller, S.InferReply(call.rid, error=err))

    def _reply(self, reply: S.InferReply) -> None:
        call = self.forwarded.get(reply.rid)
        if call is None:
            return
        if not reply.more:
            del self.forwarded[reply.rid]
            self.by_caller.pop((call.caller, call.rid), None)
        if self.is_worker(call.caller):
            reply.rid = call.rid
            self.to_worker(call.caller, reply)
            return
        leases = sorted({S.lease_of(d) for d in reply.outputs} - {0})     # the caller died meanwhile
        if leases:
            self._send(self.links[call.link], S.Release(reply.owner, leases))

    # ---------------------------------------------------------------- sending

    def _send(self, link: Link, msg: object) -> bool:
        try:
            link.sock.send(S.encode(msg), zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False

    def owner(self, name: str) -> int | None:
        """The other broker whose table lists `name`, if any."""
        for link in self.links.values():
            if link.table is not None and name in link.table.names:
                return link.index
        return None

    def ask(self, index: int, op: S.ControlOp, answer: Answer) -> None:
        """Send a control operation to broker `index`; `answer` gets its reply, or an error
        while that broker is away."""
        link = self.links[index]
        if not link.alive:
            answer(None, error=unavailable(f"broker {index} is not serving now (restarting?); retry shortly"))
            return
        cid = next(self.ids)
        self.pending[cid] = (index, answer)
        if not self._send(link, S.Control(cid, op)):
            self.pending.pop(cid, None)
            answer(None, error=unavailable(f"broker {index} is not reachable"))

    def tell(self, index: int, op: S.ControlOp) -> None:
        """A control operation whose answer nobody waits for."""
        self._send(self.links[index], S.Control(0, op))

    def forward(self, index: int, caller: bytes, msg: S.Infer) -> None:
        """A worker's BLS call to a model broker `index` schedules."""
        link = self.links[index]
        if not link.alive:
            self.to_worker(caller, S.InferReply(msg.rid, error=unavailable(
                f"the broker of model '{msg.model}' is not serving now (restarting?); retry shortly")))
            return
        rid = next(self.ids)
        self.forwarded[rid] = Forwarded(caller, msg.rid, index)
        self.by_caller[(caller, msg.rid)] = rid
        msg.rid = rid
        self._send(link, msg)

    def cancel(self, caller: bytes, rid: int) -> bool:
        """A worker gave up on a BLS call; False when it was not sent to another broker."""
        mine = self.by_caller.get((caller, rid))
        if mine is None:
            return False
        self._send(self.links[self.forwarded[mine].link], S.Cancel(mine))
        return True

    def release(self, msg: S.Release) -> bool:
        """Outputs another broker's worker lent (identity `w:model:...`) go back over its link;
        False when the owner is not another broker's worker."""
        parts = msg.owner.split(b":", 2)
        if len(parts) < 3 or parts[0] != b"w":
            return False
        index = self.owner(parts[1].decode(errors="replace"))
        if index is None:
            return False
        self._send(self.links[index], msg)
        return True

    def close(self) -> None:
        for link in self.links.values():
            link.sock.close(0)
