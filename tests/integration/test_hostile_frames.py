"""Frames a hostile local peer could put on the broker's frontend socket: each is answered
with an error or dropped, and the broker (with every model) keeps serving."""
import json

import numpy as np
import tritonclient.http as httpclient
import zmq

from tritond.broker import protocol as P


def broker_socket(server):
    [pid] = server.role_pids("tritond.broker.main")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    opts = json.loads(argv[argv.index(b"tritond.broker.main") + 1])
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{opts['run_dir']}/frontends.sock")
    return pid, ctx, sock


def replies(sock, timeout_ms=3000):
    """Broker answers (tables and pings aside) until the socket stays quiet."""
    out = []
    decoder = P.decoder(P.BrokerToFrontend)
    while sock.poll(timeout_ms):
        msg = decoder.decode(sock.recv())
        if isinstance(msg, (P.ControlReply, P.InferReply)):
            out.append(msg)
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
        sock.send(P.encode(P.Control(1, "shm_register", {})))                # missing arguments
        sock.send(P.encode(P.Control(2, "stats", {"name": "identity_fp32", "version": "abc"})))
        sock.send(P.encode(P.Control(3, "log_settings", {"settings": [1]})))
        sock.send(P.encode(P.Control(4, "no_such_op", {})))
        victim = "/tritond.not-ours"
        sock.send(P.encode(P.Infer(5, "identity_fp32", -1,
                                   [P.TensorDesc("INPUT0", "FP32", [2], data=np.ones(2, np.float32).tobytes())],
                                   [P.OutputSpec("OUTPUT0", seg=victim, nbytes=8)])))
        sock.send(P.encode(P.Infer(6, "identity_fp32", -1,
                                   [P.TensorDesc("INPUT0", "FP32", [2], seg="/etc/passwd", nbytes=8)])))
        sock.send(P.encode(P.Infer(7, "identity_fp32", -1, [P.TensorDesc("INPUT0", "FP32", [-4], data=b"")])))
        answers = {r.cid if isinstance(r, P.ControlReply) else r.rid: r for r in replies(sock)}
        assert {1, 2, 3, 4, 5, 6, 7} <= set(answers)
        for cid in (1, 2, 3):
            assert answers[cid].error.code == "INVALID_ARG"
        assert answers[4].error.code == "UNSUPPORTED"
        # The output target a sender named is ignored: the result comes back in the reply.
        assert answers[5].error is None and answers[5].outputs[0].data == np.ones(2, np.float32).tobytes()
        assert answers[6].error.code == "INVALID_ARG" and answers[7].error.code == "INVALID_ARG"
        assert "passwd" not in answers[6].error.message
    finally:
        sock.close()
        ctx.term()
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(identity(server, x), x)
    assert server.role_pids("tritond.broker.main") == [pid]
