"""sd_notify framing: datagrams to $NOTIFY_SOCKET (path or abstract), the watchdog period."""
from __future__ import annotations

import os
import socket

from tritond.notify import Notifier


def test_messages_reach_a_path_socket(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        n = Notifier({"NOTIFY_SOCKET": path})
        n.ready("serving")
        n.watchdog()
        n.stopping("draining")
        n.close()
        assert server.recv(256) == b"READY=1\nSTATUS=serving"
        assert server.recv(256) == b"WATCHDOG=1"
        assert server.recv(256) == b"STOPPING=1\nSTATUS=draining"


def test_abstract_socket_and_watchdog_period():
    name = f"tritond-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        n = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "3000000"})
        assert n.watchdog_s == 1.5
        n.status("loading models")
        assert server.recv(256) == b"STATUS=loading models"
        n.close()


def test_without_systemd_nothing_is_sent_and_a_gone_socket_is_not_fatal(tmp_path):
    n = Notifier({})
    assert not n.enabled and n.watchdog_s == 0
    n.ready("x")
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "absent"), "WATCHDOG_USEC": "1000000",
                  "WATCHDOG_PID": str(os.getpid() + 1)})
    assert n.watchdog_s == 0          # the watchdog is some other process's
    n.ready("x")                      # logged, not raised
    n.close()
