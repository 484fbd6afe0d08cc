"""How long a broker may hold a receive (proxy.receive.polltime): clamped, cut to the deadline, or refused."""

from __future__ import annotations

import pytest

from popgate_contract import errors
from popgate_contract.codes import Code, code_of
from proxy.receive.polltime import PollLimits, poll_seconds

LIMITS = PollLimits(minimum=0.0, maximum=30.0, default=20.0, reserve=0.3)


def test_poll_time_is_the_requested_time_when_the_deadline_leaves_room() -> None:
    # As RocketMQ's proxy: the reserve comes out of the deadline, not out of the long-polling time (the
    # official client's deadline is its request timeout + the long-polling time: room enough).
    assert poll_seconds(20.0, 23.0, LIMITS) == 20.0
    assert poll_seconds(0.05, 3.05, LIMITS) == 0.05  # a short poll waits too (it was answered at once)


def test_poll_time_is_clamped_to_the_maximum_and_cut_to_the_deadline() -> None:
    assert poll_seconds(120.0, None, LIMITS) == 30.0
    assert poll_seconds(20.0, 5.0, LIMITS) == pytest.approx(4.7)


def test_absent_poll_time_uses_the_default_and_zero_means_answer_at_once() -> None:
    assert poll_seconds(None, 100.0, LIMITS) == 20.0
    assert poll_seconds(0.0, 10.0, LIMITS) == 0.0


def test_a_deadline_that_leaves_no_time_for_a_longer_requested_poll_is_a_retriable_too_many_requests() -> None:
    # The client asked to poll longer than the time left: its deadline was long enough when it sent the call, the
    # time went on the way or waiting in a busy proxy. Under load such a refusal killed SDK consumer loops when it
    # was ILLEGAL_POLLING_TIME (429 of 1000 iterations in a review's probe).
    for requested, remaining in ((20.0, 0.2), (1.0, 0.3), (0.0, -0.1)):
        with pytest.raises(errors.TooManyRequests, match="proxy is behind") as caught:
            poll_seconds(requested, remaining, LIMITS)
        assert caught.value.retriable
        assert code_of(caught.value) == Code.TOO_MANY_REQUESTS


def test_a_request_timeout_too_short_to_poll_or_a_negative_poll_is_illegal_polling_time() -> None:
    # The client asked for no more time than it left (or for none): its own request timeout is too short.
    for requested in (0.0, 0.2, None):
        with pytest.raises(errors.IllegalPollingTime, match="raise the client's request timeout") as caught:
            poll_seconds(requested, 0.2, LIMITS)
        assert not caught.value.retriable
        assert code_of(caught.value) == Code.ILLEGAL_POLLING_TIME
    with pytest.raises(errors.IllegalPollingTime, match="negative"):
        poll_seconds(-1.0, 10.0, LIMITS)
