"""The real supervisor, driven in-process: no processes, no sockets to a broker, no signals
sent, a fake clock.

`FakeChildren` keeps records instead of processes (a frontend still gets its readiness
socket pair: it says "listening" at once, and acknowledges "serving"), `FakeLink` plays the broker
(its model table on connect, a ping every half second while it answers, replies to control
ops), and the clock runs only when the supervisor waits, so scheduled events (a death, a
signal, a broker falling silent) happen at exact times.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import signal
import socket
from collections import deque
from collections.abc import Callable, Iterable

import pytest

from tritond.frontend.readiness import LISTENING, SERVING
from tritond.notify import Notifier
from tritond.supervisor import ExitCode, Supervisor
from tritond.supervisor.broker_link import BrokerLink, Waitable
from tritond.supervisor.children import Child, ChildProcesses
from tritond.supervisor.clock import Clock
from tritond.supervisor.restart import RESTART_LIMIT, RESTART_WINDOW_S
from tritond.supervisor.signals import Signals
from tritond.wire import options as wire_options, replies, schema as S

T0 = 1000.0
PING_S = 0.5


class FakeClock(Clock):
    """Time moves only when the supervisor waits or sleeps; a wait ends early at the first
    scheduled event, as a real one ends when a descriptor turns readable."""

    def __init__(self) -> None:
        self.t = T0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()
        self.still = 0             # waits in a row that let no time pass: a busy loop if many

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def at(self, offset: float, event: Callable[[], None]) -> None:
        heapq.heappush(self.events, (T0 + offset, next(self.order), event))

    def advance(self, seconds: float) -> None:
        self.still = 0 if seconds > 0 else self.still + 1
        assert self.still < 1000, "the supervisor spins: it waits without a timeout"
        end = self.t + seconds
        if self.events and self.events[0][0] <= end:
            t, _, event = heapq.heappop(self.events)
            self.t = max(self.t, t)
            event()
            return
        self.t = end
        assert self.t < T0 + 10_000, "the supervisor never stopped"


class FakeChildren(ChildProcesses):
    """Processes as records: each runs until the test ends it or it is signalled to stop."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.pids = itertools.count(70000)
        self.codes: dict[int, int | None] = {}       # pid -> exit code, None while it runs
        self.ends: dict[int, socket.socket] = {}     # a frontend's end of its readiness pair
        self.spawned: list[str] = []
        self.sent: list[tuple[str, int]] = []
        self.frontends_answer = True                 # frontends say "listening" when they start
        self.told_serving: list[int] = []

    def spawn(self, child: Child, options: str, pass_fds: tuple[int, ...] = ()) -> None:
        child.pid = next(self.pids)
        child.pidfd = child.pid                      # unique, and never a real descriptor
        self.codes[child.pid] = None
        self.spawned.append(child.role)
        if pass_fds:
            end = self.ends[child.pid] = socket.socket(fileno=os.dup(pass_fds[0]))
            if self.frontends_answer:
                end.send(LISTENING)

    def frontends_act(self) -> None:
        """Each frontend told to serve acknowledges, as a real one does once it answers ready."""
        for pid, end in self.ends.items():
            if select.select([end], [], [], 0)[0] and end.recv(64) == SERVING:
                self.told_serving.append(pid)
                end.send(SERVING)

    def exit_code(self, child: Child) -> int | None:
        return self.codes.get(child.pid)

    def running(self, child: Child) -> bool:
        return child.pid in self.codes and self.codes[child.pid] is None

    def die(self, child: Child, code: int) -> None:
        if self.running(child):
            self.codes[child.pid] = code
            if child.pid in self.ends:
                self.ends.pop(child.pid).close()

    def signal(self, child: Child, sig: int) -> None:
        if self.running(child):
            self.sent.append((child.role, sig))
            if sig in (signal.SIGTERM, signal.SIGKILL):
                self.die(child, 0 if sig == signal.SIGTERM else -sig)

    def wait(self, child: Child, timeout_s: float | None) -> bool:
        return not self.running(child)

    def reap(self, child: Child) -> int:
        child.pidfd = -1
        return self.codes.pop(child.pid)

    def reap_orphans(self, server_id: str, keep: set[int]) -> None:
        pass

    def exited(self) -> set[int]:
        return {pid for pid, code in self.codes.items() if code is not None}

    def count(self, role: str) -> int:
        return self.spawned.count(role)


class FakeLink(BrokerLink):
    """The broker, as the supervisor hears it."""

    def __init__(self, clock: FakeClock, children: FakeChildren) -> None:
        super().__init__()
        self.clock = clock
        self.children = children
        self.broker: Child | None = None
        self.inbox: deque[S.BrokerToFrontend] = deque()
        self.ops: list[S.ControlOp] = []
        self.models: list[S.ModelEntry] = [S.ModelEntry("m", 1, S.ModelState.READY)]
        self.load_s = 0.0          # how long a broker takes to load its startup models
        self.drained = True        # what the broker answers to Drain
        self.silent = False        # the running broker stopped sending anything (hung)
        self.loaded_at = 0.0
        self.told_table = False
        self.next_ping = 0.0

    def connect(self, endpoint: str) -> None:
        self.inbox.clear()
        self.silent = False
        self.told_table = False
        self.loaded_at = self.clock.now() + self.load_s

    def answering(self) -> bool:
        return self.children.running(self.broker) and not self.silent

    def speak(self) -> None:
        """What the broker has said by now: its table once loaded, then its pings."""
        now = self.clock.now()
        if not self.answering():
            return
        if not self.told_table and now >= self.loaded_at:
            self.inbox.append(S.Table(1, self.models, [m.name for m in self.models], True))
            self.told_table = True
            self.next_ping = now + PING_S
        elif self.told_table and now >= self.next_ping:
            self.inbox.append(S.Ping())
            self.next_ping = now + PING_S

    def request(self, op: S.ControlOp) -> int:
        self._cids += 1
        self.ops.append(op)
        if self.answering():
            result = self.answer(op)
            self.inbox.append(S.ControlReply(self._cids, result))
            if isinstance(op, S.StopServer):
                self.children.die(self.broker, 0)
        return self._cids

    def answer(self, op: S.ControlOp) -> replies.ControlResult:
        if isinstance(op, S.Drain):
            return replies.DrainReply(self.drained)
        if isinstance(op, S.ModelMetrics):
            return replies.MetricsReply([], 1, [], 0, 0)
        return None

    def tell(self, op: S.ControlOp) -> None:
        self.ops.append(op)

    def pending(self) -> bool:
        self.speak()
        return bool(self.inbox)

    def receive(self) -> S.BrokerToFrontend:
        return self.inbox.popleft()

    def wait(self, others: Iterable[Waitable], timeout_s: float) -> set[Waitable]:
        others = list(others)
        ready = self.readable(others)
        self.clock.advance(0.0 if ready or self.pending() else timeout_s)
        return ready | self.readable(others)

    def readable(self, others: list[Waitable]) -> set[Waitable]:
        self.children.frontends_act()
        sockets = [o for o in others if isinstance(o, socket.socket)]
        out = set(select.select(sockets, [], [], 0)[0]) if sockets else set()
        return out | {o for o in others if isinstance(o, int) and o in self.children.exited()}

    def op_kinds(self) -> list[str]:
        return [type(op).__name__ for op in self.ops]


class FakeSignals(Signals):
    def install(self) -> None:
        pass


class RecordingNotifier(Notifier):
    def __init__(self, clock: FakeClock, watchdog_s: float = 0.0) -> None:
        super().__init__({})
        self.clock = clock
        self.watchdog_s = watchdog_s
        self.sent: list[tuple[float, tuple[str, ...]]] = []

    def send(self, *fields: str) -> None:
        self.sent.append((self.clock.now(), fields))

    def pets(self) -> list[float]:
        return [t for t, fields in self.sent if fields == ("WATCHDOG=1",)]


class Harness:
    def __init__(self, tmp_path, watchdog_s: float = 0.0, **opts) -> None:
        values = {"model_repositories": [str(tmp_path)], "http_port": 0, "grpc_port": 0, "metrics_port": 0,
                  "broker_hang_timeout_secs": 5.0, "exit_timeout_secs": 5.0, **opts}
        self.clock = FakeClock()
        self.children = FakeChildren(self.clock)
        self.link = FakeLink(self.clock, self.children)
        self.signals = FakeSignals()
        self.notify = RecordingNotifier(self.clock, watchdog_s)
        self.sup = Supervisor(wire_options.build(values), clock=self.clock, children=self.children,
                              link=self.link, signals=self.signals, notify=self.notify)
        self.link.broker = self.sup.broker

    def at(self, offset: float, event: Callable[[], None]) -> Harness:
        self.clock.at(offset, event)
        return self

    def kill_broker(self, code: int = -9) -> None:
        self.children.die(self.sup.broker, code)

    def signal(self, offset: float, signum: int = signal.SIGTERM) -> Harness:
        return self.at(offset, lambda: self.sup.signals.caught(signum))

    def run(self) -> ExitCode:
        code = self.sup.run()
        for end in self.children.ends.values():
            end.close()
        return code


@pytest.fixture(autouse=True)
def _log_level(caplog):
    caplog.set_level(logging.INFO, "tritond")


# ------------------------------------------------------------------------- construction and seams

def test_building_a_supervisor_installs_nothing_and_starts_nothing(tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)}
    sup = Supervisor(wire_options.build({"model_repositories": [str(tmp_path)]}))
    assert {s: signal.getsignal(s) for s in before} == before
    assert sup.link._ctx is None and sup.run_dir == "" and sup.broker.pid == 0
    sup.cleanup()


def test_install_routes_each_signal_to_its_count():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)}
    signals = Signals()
    try:
        signals.install()
        assert all(signal.getsignal(s) == signals.caught for s in saved)
        assert signals.fd >= 0
    finally:
        old = signal.set_wakeup_fd(-1)
        for s, handler in saved.items():
            signal.signal(s, handler)
        os.close(signals.fd)
        os.close(old)


def test_signals_are_counted_and_the_first_stop_signal_kept():
    signals = Signals()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGHUP, signal.SIGUSR1):
        signals.caught(s)
    assert (signals.stop, signals.hangups, signals.reopens) == (signal.SIGINT, 2, 1)


def test_the_real_link_answers_with_the_objects_it_was_given():
    """ZeroMQ's poller reports a Python socket by its descriptor; the loop looks for the socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    with ours, theirs:
        link = BrokerLink()
        assert link.wait([ours, r], 0.0) == set()
        theirs.send(LISTENING)
        os.write(w, b"x")
        assert link.wait([ours, r], 0.0) == {ours, r}
    os.close(r)
    os.close(w)


# ------------------------------------------------------------------------- restart window

def test_the_broker_is_restarted_up_to_the_limit_then_the_server_gives_up(tmp_path, caplog):
    h = Harness(tmp_path)
    for i in range(RESTART_LIMIT + 1):
        h.at(1.0 + i, h.kill_broker)
    assert h.run() == ExitCode.GAVE_UP
    assert h.children.count("broker") == RESTART_LIMIT + 1
    assert f"the broker process died {RESTART_LIMIT + 1} times in {RESTART_WINDOW_S:g}s; giving up" in caplog.text
    assert ("http", signal.SIGTERM) in h.children.sent and not h.children.running(h.sup.broker)


def test_deaths_spread_wider_than_the_window_are_restarted_every_time(tmp_path):
    h = Harness(tmp_path)
    gap = RESTART_WINDOW_S / (RESTART_LIMIT - 1)     # never more than RESTART_LIMIT in a window
    for i in range(3 * RESTART_LIMIT):
        h.at(1.0 + i * gap, h.kill_broker)
    h.signal(2.0 + 3 * RESTART_LIMIT * gap)
    assert h.run() == ExitCode.CLEAN
    assert h.children.count("broker") == 3 * RESTART_LIMIT + 1


def test_a_frontend_that_keeps_dying_makes_the_server_give_up(tmp_path, caplog):
    h = Harness(tmp_path, allow_grpc=False)
    for i in range(RESTART_LIMIT + 1):
        h.at(1.0 + i, lambda: h.children.die(h.sup.frontends[0], 1))
    assert h.run() == ExitCode.GAVE_UP
    assert h.children.count("http") == RESTART_LIMIT + 1 and h.children.count("broker") == 1
    assert "the http process died 6 times" in caplog.text
    assert h.link.op_kinds()[-1] == "StopServer"


def test_a_restarted_frontend_is_told_to_serve(tmp_path):
    h = Harness(tmp_path, allow_grpc=False)
    pids, states = [], []
    h.at(0.5, lambda: pids.append(h.sup.frontends[0].pid))
    h.at(1.0, lambda: h.children.die(h.sup.frontends[0], 1))
    h.at(3.0, lambda: (pids.append(h.sup.frontends[0].pid), states.append(h.sup.frontends[0].link_state)))
    h.signal(4.0)
    assert h.run() == ExitCode.CLEAN
    assert h.children.told_serving == pids and pids[0] != pids[1]
    assert states == [SERVING]


# ------------------------------------------------------------------------- hang detection

def test_a_broker_that_stops_pinging_is_killed_after_the_hang_timeout_and_restarted(tmp_path, caplog):
    h = Harness(tmp_path, broker_hang_timeout_secs=5.0)
    killed_at = []
    h.at(10.0, lambda: setattr(h.link, "silent", True))
    h.signal(40.0)
    orig = h.children.signal

    def record(child: Child, sig: int) -> None:
        if child is h.sup.broker and sig == signal.SIGKILL:
            killed_at.append(h.clock.now() - T0)
        orig(child, sig)

    h.children.signal = record
    assert h.run() == ExitCode.CLEAN
    [t] = killed_at
    assert 10.0 - 1.0 + 5.0 <= t <= 10.0 + 5.0 + 1.0     # the timeout after its last ping, within a loop turn
    assert h.children.count("broker") == 2
    assert "it is hung; killing it" in caplog.text and "was killed as hung" in caplog.text
    assert "the broker is back" in caplog.text
    assert h.link.op_kinds()[-2:] == ["Drain", "StopServer"]


def test_a_broker_loading_its_models_is_not_judged_by_its_silence(tmp_path):
    h = Harness(tmp_path, broker_hang_timeout_secs=5.0)
    h.link.load_s = 30.0
    h.signal(40.0)
    assert h.run() == ExitCode.CLEAN
    assert h.children.count("broker") == 1 and ("broker", signal.SIGKILL) not in h.children.sent


def test_systemd_is_petted_only_while_the_broker_answers(tmp_path):
    h = Harness(tmp_path, watchdog_s=1.0, broker_hang_timeout_secs=60.0)
    h.at(10.0, lambda: setattr(h.link, "silent", True))
    h.signal(20.0)
    h.run()
    pets = [t - T0 for t in h.notify.pets()]
    assert [round(t) for t in pets if t < 10.0] == list(range(10))     # every half WatchdogSec
    assert not [t for t in pets if t > 10.0 - PING_S + 3.0]             # not past 3 s of silence


def test_systemd_is_petted_while_frontends_start(tmp_path):
    """The broker's pings are read while frontends start, so a slow frontend start is not
    taken for a silent broker."""
    h = Harness(tmp_path, watchdog_s=1.0, allow_grpc=False)
    h.children.frontends_answer = False

    def frontend_listens() -> None:
        h.children.ends[h.sup.frontends[0].pid].send(LISTENING)

    h.at(10.0, frontend_listens)
    h.signal(12.0)
    assert h.run() == ExitCode.CLEAN
    pets = [t - T0 for t in h.notify.pets()]
    assert [round(t) for t in pets if t < 10.0] == list(range(10))


# ------------------------------------------------------------------------- exit codes

def test_sigterm_drains_then_stops_every_process(tmp_path):
    h = Harness(tmp_path).signal(5.0)
    assert h.run() == ExitCode.CLEAN
    assert h.link.op_kinds()[-2:] == ["Drain", "StopServer"]
    assert ("http", signal.SIGTERM) in h.children.sent and ("grpc", signal.SIGTERM) in h.children.sent
    assert not h.children.running(h.sup.broker)
    assert not os.path.exists(h.sup.run_dir)


def test_sigint_drains_as_sigterm_does(tmp_path):
    h = Harness(tmp_path).signal(5.0, signal.SIGINT)
    assert h.run() == ExitCode.CLEAN
    assert "Drain" in h.link.op_kinds()


def test_requests_left_at_the_exit_timeout_exit_2(tmp_path, caplog):
    h = Harness(tmp_path).signal(5.0)
    h.link.drained = False
    assert h.run() == ExitCode.CANCELLED
    assert "exit timeout expired with requests in flight" in caplog.text


def test_a_broker_that_does_not_answer_the_drain_exits_2(tmp_path):
    h = Harness(tmp_path, broker_hang_timeout_secs=60.0, exit_timeout_secs=5.0)
    h.at(4.0, lambda: setattr(h.link, "silent", True))
    h.signal(5.0)
    assert h.run() == ExitCode.CANCELLED
    assert h.clock.now() - T0 >= 5.0 + 5.0 + 5.0      # the drain's wait: the exit timeout and 5 s
    assert ("broker", signal.SIGKILL) in h.children.sent


def test_sigterm_while_the_broker_loads_stops_without_a_drain(tmp_path, caplog):
    h = Harness(tmp_path).signal(3.0)
    h.link.load_s = 100.0
    assert h.run() == ExitCode.CLEAN
    assert "Drain" not in h.link.op_kinds() and "interrupted during startup" in caplog.text
    assert h.children.count("http") == 0


def test_a_model_that_failed_with_exit_on_error_exits_1(tmp_path, caplog):
    h = Harness(tmp_path)
    h.link.models = [S.ModelEntry("m", 1, S.ModelState.UNAVAILABLE, "broken")]
    assert h.run() == ExitCode.STARTUP_FAILED
    assert "failed to load at startup (--exit-on-error=true): 'm' version 1" in caplog.text
    assert "broken" not in caplog.text      # the broker logged the reason, once
    assert h.children.spawned == ["broker"] and h.link.op_kinds() == ["StopServer"]


def test_a_model_that_failed_without_exit_on_error_serves(tmp_path):
    h = Harness(tmp_path, exit_on_error=False).signal(5.0)
    h.link.models = [S.ModelEntry("m", 1, S.ModelState.UNAVAILABLE, "broken")]
    assert h.run() == ExitCode.CLEAN
    assert h.children.spawned == ["broker", "http", "grpc"]


def test_a_broker_that_exits_while_it_loads_exits_1(tmp_path, caplog):
    h = Harness(tmp_path).at(1.0, lambda: h.kill_broker(7))
    h.link.load_s = 10.0
    assert h.run() == ExitCode.STARTUP_FAILED
    assert "the broker exited during startup (code 7)" in caplog.text


def test_a_port_in_use_exits_1_before_anything_starts(tmp_path, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        h = Harness(tmp_path, http_port=taken.getsockname()[1])
        assert h.run() == ExitCode.STARTUP_FAILED
    assert "failed to start HTTP service: Unavailable - Socket" in caplog.text
    assert h.children.spawned == []


def test_a_frontend_that_exits_during_startup_exits_1(tmp_path, caplog):
    h = Harness(tmp_path, allow_grpc=False)
    h.children.frontends_answer = False
    h.at(2.0, lambda: h.children.die(h.sup.frontends[0], 1))
    assert h.run() == ExitCode.STARTUP_FAILED
    assert "the http frontend exited during startup (code 1)" in caplog.text
    assert h.link.op_kinds()[-1] == "StopServer"


def test_a_broker_that_cannot_be_restarted_exits_3(tmp_path, caplog):
    h = Harness(tmp_path)

    def broken_repository() -> None:
        h.link.load_s = 10.0
        h.kill_broker()
        h.clock.at(7.0, lambda: h.kill_broker(1))

    h.at(5.0, broken_repository)
    assert h.run() == ExitCode.GAVE_UP
    assert "could not restart the broker: the broker exited during startup (code 1)" in caplog.text
    assert ("http", signal.SIGTERM) in h.children.sent


def test_sigterm_while_the_broker_restarts_exits_0(tmp_path, caplog):
    h = Harness(tmp_path)

    def slow_restart() -> None:
        h.link.load_s = 10.0
        h.kill_broker()

    h.at(5.0, slow_restart).signal(7.0)
    assert h.run() == ExitCode.CLEAN
    assert "interrupted while the broker restarted" in caplog.text


# ------------------------------------------------------------------------- other signals

def test_sighup_is_forwarded_to_every_child(tmp_path):
    h = Harness(tmp_path).signal(2.0, signal.SIGHUP).signal(4.0)
    assert h.run() == ExitCode.CLEAN
    assert [r for r, s in h.children.sent if s == signal.SIGHUP] == ["broker", "http", "grpc"]


def test_sigusr1_reopens_the_log_through_the_broker(tmp_path):
    h = Harness(tmp_path).signal(2.0, signal.SIGUSR1).signal(4.0)
    assert h.run() == ExitCode.CLEAN
    assert "ReopenLog" in h.link.op_kinds()

