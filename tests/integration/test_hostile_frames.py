"""Frames a hostile local peer could put on the broker's frontend socket: each is answered
with an error or dropped, and the broker (with every model) keeps serving."""

import msgspec
import numpy as np
import tritonclient.http as httpclient
import zmq

from tritond.wire import options as wire_options, schema as P
from tritond.wire.errors import Code


def broker_socket(server):
    [pid] = server.role_pids("tritond.broker.main")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    opts = wire_options.decode(argv[argv.index(b"tritond.broker.main") + 1])
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{opts.run_dir}/frontends.sock")
    return pid, ctx, sock


def replies(sock, timeout_ms=3000):
    """Broker answers (tables and pings aside) until the socket stays quiet."""
    out = []
    decoder = P.decoder(P.BrokerToFrontend)
    while sock.poll(timeout_ms):
        msg = decoder.decode(sock.recv())
        if isinstance(msg, (P.ControlReply, P.InferReply, P.Replies)):
            out.extend(msg.replies if isinstance(msg, P.Replies) else [msg])
            timeout_ms = 300
    return out


def identity(server, x):
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")


def test_malformed_and_hostile_frames_leave_the_broker_serving(server):
    pid, ctx, sock = broker_socket(server)
    try:
        sock.send(b"\xc1 not msgpack")
        sock.send_multipart([b"two", b"frames"])
        sock.send(b"\x91" * 5000 + b"\xc0")                                  # nested 5000 deep
        sock.send(msgspec.msgpack.encode(["control", 11, ["shm_register"]]))        # missing arguments
        sock.send(msgspec.msgpack.encode(["control", 12, ["stats", "identity_fp32", "abc"]]))
        sock.send(msgspec.msgpack.encode(["control", 13, ["no_such_op"]]))
        sock.send(msgspec.msgpack.encode(["reply", 14, 0, [], ["NOT_A_CODE", "x"]]))
        sock.send(P.encode(P.Control(1, P.LogSettings({"log_info": 3}))))
        sock.send(P.encode(P.Control(2, P.ShmRegister("r", "k", 0, 8))))    # no such segment
        victim = "/tritond.not-ours"
        ones = np.ones(2, np.float32).tobytes()
        sock.send(P.encode(P.Infer(5, "identity_fp32", -1, [P.TensorDesc("INPUT0", "FP32", [2], P.Inline(ones))],
                                   [P.OutputSpec("OUTPUT0", device_ok=True, region=P.Region("r", 0, 8, victim))])))
        sock.send(P.encode(P.Infer(6, "identity_fp32", -1,
                                   [P.TensorDesc("INPUT0", "FP32", [2], P.Block("/etc/passwd", 0, 8))])))
        sock.send(P.encode(P.Infer(7, "identity_fp32", -1, [P.TensorDesc("INPUT0", "FP32", [-4], P.Inline(b""))])))
        sock.send(P.encode(P.Infer(8, "identity_fp32", -1,
                                   [P.TensorDesc("INPUT0", "FP32", [2], P.Device(b"h" * 64, 0, 0, 8, 1))])))
        answers = {r.cid if isinstance(r, P.ControlReply) else r.rid: r for r in replies(sock)}
        assert set(answers) == {1, 2, 5, 6, 7, 8}            # frames that do not decode are dropped
        assert answers[1].error.code is Code.INVALID_ARG
        assert answers[2].error.code is Code.INTERNAL
        # A region the sender resolved itself is resolved again: this one is not registered.
        assert answers[5].error.code is Code.NOT_FOUND and "not-ours" not in answers[5].error.message
        for rid in (6, 7, 8):
            assert answers[rid].error.code is Code.INVALID_ARG
        assert "passwd" not in answers[6].error.message
    finally:
        sock.close()
        ctx.term()
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(identity(server, x), x)
    assert server.role_pids("tritond.broker.main") == [pid]
