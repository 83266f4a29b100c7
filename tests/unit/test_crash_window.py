"""The crash-loop rule the supervisor and the broker's worker pool share."""
from __future__ import annotations

from tritond.crash_window import CrashWindow


def test_crashes_up_to_the_limit_are_allowed_and_the_next_is_not():
    w = CrashWindow(3, 60.0)
    assert [w.record(t) for t in (0.0, 1.0, 2.0, 3.0)] == [True, True, True, False]
    assert len(w) == 4


def test_crashes_older_than_the_window_no_longer_count():
    w = CrashWindow(2, 10.0)
    assert w.record(0.0) and w.record(5.0)
    assert w.record(10.0)            # the crash at 0 is exactly one window old: it left
    assert w.times == [5.0, 10.0]
    assert not w.record(14.9)


def test_a_steady_rate_under_the_limit_never_gives_up():
    w = CrashWindow(5, 60.0)
    assert all(w.record(15.0 * i) for i in range(100))


def test_clear_forgets_every_crash():
    w = CrashWindow(1, 60.0)
    w.record(0.0)
    w.clear()
    assert w.record(1.0) and w.times == [1.0]
