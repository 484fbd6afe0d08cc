"""How long the proxy may hold a receive at a broker. Pure.

The client's deadline is request_timeout + long_polling_timeout; the proxy asks a
broker to hold the poll for the requested time clamped to the configured range and,
only when the deadline is closer than that, cut to leave `reserve` before it, so the
answer (empty or not) always reaches the client in time.

A deadline that leaves no time at all is refused (RocketMQ's ReceiveMessageActivity:
ILLEGAL_POLLING_TIME), here with one of two errors. The client asked to poll longer than the
time left: its deadline was long enough when it sent the call, the time went on the way or
waiting in a busy proxy, so TOO_MANY_REQUESTS, which clients retry. It asked for no more than
that: its own request timeout is too short, ILLEGAL_POLLING_TIME.
"""

from __future__ import annotations

from dataclasses import dataclass

from popgate_contract.errors import IllegalPollingTime, TooManyRequests


@dataclass(frozen=True, slots=True)
class PollLimits:
    minimum: float
    maximum: float
    default: float
    reserve: float


def poll_seconds(requested: float | None, remaining: float | None, limits: PollLimits) -> float:
    """Seconds to hold the poll at a broker (0 = answer at once).

    requested: the client's long_polling_timeout, None when absent.
    remaining: seconds until the client's deadline, None when the call has none.
    """
    if requested is not None and requested < 0:
        raise IllegalPollingTime(f"long_polling_timeout {requested:g} s is negative")
    wanted = limits.default if requested is None else requested
    wanted = min(max(wanted, limits.minimum), limits.maximum)
    if remaining is None:
        return wanted
    usable = remaining - limits.reserve
    if usable > 0:
        return min(wanted, usable)
    left = max(remaining, 0)
    if requested is not None and requested > remaining:
        raise TooManyRequests(
            f"the proxy is behind: a call that asked to poll {requested:g} s reached it {left:.3f} s before its "
            f"deadline, less than the {limits.reserve:g} s the proxy keeps to answer; retry shortly"
        )
    raise IllegalPollingTime(
        f"the call's deadline leaves {left:.3f} s, less than the {limits.reserve:g} s the proxy keeps to answer: "
        "not enough to poll; raise the client's request timeout"
    )
