"""When an asyncio receive on the Session stream asks again, and for how long (sans-IO: the caller gives the times).

A receive asks again for the rest of its wait when its answer was cut short by the receives it was joined with
(`_joining.CUT_SHORT`: the others took every message that came) or when the proxy ended its stream before answering
(`_session.Ended`: its connection aging, its messages given back). Neither is a failed attempt: the receive answers
empty only once its wait is over and nothing is ready — tests/unit/sdk/test_again.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from . import errors


class WaitSpent(errors.Unavailable):
    """The proxy ended stream after stream as soon as a receive asked on them, until its wait was over: `receive()`
    raises it, not asking its whole wait again (a proxy that ends every stream would make it last max_attempts
    waits); an iteration retries it as any retriable error — tests/unit/sdk/test_retry_loop.py::
    test_a_receive_asks_again_for_the_rest_of_its_wait_when_its_stream_ends_and_backs_off."""


class Again:
    """One receive's asks: its whole `wait` from `started`, then each ask again for what is left of it."""

    __slots__ = ("_delays", "_ends", "_started", "_wait", "again", "asked", "asked_at", "backed_off")

    def __init__(self, wait: float, started: float, delays: Callable[[], Iterator[float]]) -> None:
        """`delays`: the retry policy's back-off, started anew for each run of stream ends."""
        self._wait, self._started = wait, started
        self._delays = delays
        self._ends: Iterator[float] | None = None
        self.asked, self.asked_at = wait, started  # the last ask's wait, and when it went
        self.again = False  # asked again at least once
        self.backed_off = False  # the last ends came sooner than the back-off's delay: streams end as soon as asked

    def cut_short(self, now: float) -> bool:
        """Whether a receive cut short asks again: while its wait lasts, and once at least (not waiting)."""
        return self._rest(now) > 0 or not self.again

    def ended(self, now: float) -> float | None:
        """The back-off before a receive whose stream ended asks again, or None when it does not: the ask that ended
        asked no wait and none is left (the end is then an attempt that failed: `WaitSpent` once `backed_off`, else
        an Unavailable retried as any other). An end soon after its ask (sooner than the policy's next delay) backs
        off, growing as ends follow one another; a stream that served its ask longer is asked again at once, the
        back-off starting over."""
        rest = self._rest(now)
        if rest <= 0 and self.asked <= 0:
            return None
        self._ends = self._ends or self._delays()
        delay = next(self._ends)
        if now - self.asked_at >= delay:
            self._ends = None
            self.backed_off = False
            return 0.0
        self.backed_off = True
        return min(delay, rest) if rest > 0 else 0.0

    def asking(self, now: float) -> float:
        """The receive asks again now: the wait it asks, what is left of its own (0 once none is)."""
        rest = self._rest(now)
        self.again = True
        self.asked, self.asked_at = (rest if rest > 0 else 0.0), now
        return self.asked

    def _rest(self, now: float) -> float:
        return self._wait - (now - self._started)
