"""conftest's wait_for and expect_error: what they return and how they fail."""
from __future__ import annotations

import time

import pytest
from tritonclient.utils import InferenceServerException

from conftest import expect_error, wait_for


def test_wait_for_returns_the_first_true_value():
    values = iter([None, [], [7]])
    assert wait_for(lambda: next(values), 5, every=0.001) == [7]


def test_wait_for_fails_after_the_timeout_naming_what_and_the_last_value():
    calls = []
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0.2 s waiting for the door \(last: 0\)"):
        wait_for(lambda: calls.append(1) or 0, 0.2, "the door", every=0.05)
    assert 0.2 <= time.monotonic() - start < 2
    assert 3 <= len(calls) <= 6                      # checked again after the last sleep


def test_wait_for_checks_once_even_with_no_time_and_describes_late():
    with pytest.raises(AssertionError, match="waiting for 3 of 4"):
        wait_for(lambda: False, 0, lambda: "3 of 4")


def test_expect_error_checks_status_and_text_and_returns_the_error():
    def refuse(status: str, message: str = "Request for unknown model: 'x' is not found"):
        def call():
            raise InferenceServerException(message, status=status)
        return call

    e = expect_error(refuse("400"), 400, "unknown model")
    assert e.status() == "400"
    expect_error(refuse("StatusCode.INVALID_ARGUMENT"), 400, "unknown model", protocol="grpc")
    expect_error(refuse("StatusCode.ALREADY_EXISTS"), 400, "model", protocol="grpc", grpc_code="ALREADY_EXISTS")
    expect_error(refuse("400"), text="Request for unknown model: 'x' is not found", exact=True)
    for wrong in (lambda: expect_error(refuse("404"), 400),
                  lambda: expect_error(refuse("StatusCode.NOT_FOUND"), 400, protocol="grpc"),
                  lambda: expect_error(refuse("400"), 400, "unknown", exact=True),
                  lambda: expect_error(refuse("400"), 400, "nope"),
                  lambda: expect_error(refuse("400", "segment tritond.abc"), 400, absent=("tritond.",))):
        with pytest.raises(AssertionError):
            wrong()
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        expect_error(lambda: None, 400)
