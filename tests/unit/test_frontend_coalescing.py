"""What a frontend sends in one loop turn reaches the broker as one ZeroMQ message, and the
broker handles every frame of it; a message that cannot leave fails the requests it held."""
from __future__ import annotations

import asyncio

import zmq

from tritond.broker.sockets import BrokerSockets
from tritond.frontend.broker_client import BrokerClient
from tritond.wire import schema as S
from tritond.wire.addresses import Addresses
from tritond.wire.errors import Code, TritonError


def _messages(sock: zmq.Socket) -> list[list[bytes]]:
    out = []
    while sock.poll(200):
        out.append(sock.recv_multipart())
    return out


def test_one_turn_of_requests_leaves_as_one_message_the_broker_reads_whole(tmp_path):
    sockets = BrokerSockets(str(tmp_path))
    handled: list[tuple[bytes, S.FrontendMsg]] = []
    decoder = S.decoder(S.FrontendMsg)

    async def go() -> None:
        client = BrokerClient(Addresses(str(tmp_path)).frontends, "http")
        client._connect()
        await asyncio.sleep(0.05)           # the ipc connection comes up
        for rid in (1, 2, 3):
            client._send(S.encode(S.Infer(rid, "m")), rid)
        await asyncio.sleep(0)              # the end of the loop turn: one flush
        await asyncio.sleep(0.05)
        client._send(S.encode(S.Cancel(1)))
        await asyncio.sleep(0.05)
        client.close()

    asyncio.run(go())
    for _ in range(20):
        if sockets.fe.poll(100):
            sockets.drain(sockets.fe, lambda ident, frame: handled.append((ident, decoder.decode(frame))))
        if len(handled) == 4:
            break
    sockets.close()
    assert [type(m).__name__ for _, m in handled] == ["Infer", "Infer", "Infer", "Cancel"]
    assert [m.rid for _, m in handled] == [1, 2, 3, 1]
    assert len({ident for ident, _ in handled}) == 1


def test_the_turn_is_one_message_on_the_wire(tmp_path):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    endpoint = f"ipc://{tmp_path}/fe.sock"
    router.bind(endpoint)

    async def go() -> None:
        client = BrokerClient(endpoint, "grpc")
        client._connect()
        await asyncio.sleep(0.05)
        for rid in (7, 8):
            client._send(S.encode(S.Infer(rid, "m")), rid)
        await asyncio.sleep(0.05)
        client.close()

    asyncio.run(go())
    messages = _messages(router)
    router.close(0)
    ctx.term()
    assert len(messages) == 1 and len(messages[0]) == 3       # identity + two frames


def test_a_message_that_cannot_leave_fails_the_requests_it_held(tmp_path):
    async def go() -> TritonError:
        client = BrokerClient(f"ipc://{tmp_path}/nobody.sock", "http")
        client._connect()                   # IMMEDIATE: nothing queues for a broker not there
        client.alive = True
        try:
            await asyncio.wait_for(client.infer(S.Infer(client.next_id(), "m")), 2.0)
        except TritonError as e:
            return e
        finally:
            client.close()
        raise AssertionError("the request was not failed")

    err = asyncio.run(go())
    assert err.code == Code.UNAVAILABLE and "not reachable" in err.message
