"""How many requests a Session stream has pending, against the proxy's bound (sans-IO): a request past it waits
here, first come first served, instead of being sent to be refused (`sdk/_session.py` does the waiting).

A receive may take `RECEIVE_SHARE` of the bound; the rest stays free for sends, acks and nacks, which so never wait
behind receives — tests/unit/sdk/test_session_room.py.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque

from popgate_contract.session_headers import MAX_PENDING_REQUESTS

# The share of the bound receives may take. The rest also covers requests the proxy still counts a moment after
# their caller stopped waiting (a cancel on its way).
RECEIVE_SHARE = 0.75
COMPACT_AT = 64  # callers that stopped waiting, left in a queue, past which the queues are swept


class Room:
    """Requests pending on one stream (`pending`, of them `receives`) and the callers waiting for room (futures
    resolved, in their order, once room is theirs: it is then counted for them)."""

    def __init__(self, bound: int = MAX_PENDING_REQUESTS) -> None:
        self.pending = 0
        self.receives = 0
        self._bound = bound
        self._receive_bound = max(1, int(bound * RECEIVE_SHARE))
        self._short: deque[asyncio.Future[None]] = deque()
        self._long: deque[asyncio.Future[None]] = deque()  # receives
        self._gone = 0  # futures in the queues whose caller stopped waiting

    def take(self, kind: str) -> bool:
        """Room for a request of `kind` now (then counted), none if others of its class wait before it."""
        if kind == "receive":
            if self._long or self.receives >= self._receive_bound or self.pending >= self._bound:
                return False
            self.receives += 1
        elif self._short or self.pending >= self._bound:
            return False
        self.pending += 1
        return True

    def queue(self, kind: str, future: asyncio.Future[None]) -> None:
        """`future` resolves once room is this caller's (counted for it)."""
        (self._long if kind == "receive" else self._short).append(future)

    def gone(self) -> None:
        """A caller queued stopped waiting (timed out, cancelled) before room was its."""
        self._gone += 1
        if self._gone > COMPACT_AT and self._gone * 2 > len(self._short) + len(self._long):
            self._short = deque(f for f in self._short if not f.done())
            self._long = deque(f for f in self._long if not f.done())
            self._gone = 0

    def release(self, kind: str) -> None:
        """A request counted is no longer pending: the room goes to the callers waiting, in their order."""
        self.pending -= 1
        if kind == "receive":
            self.receives -= 1
        if self._short or self._long:
            self._admit()

    def _admit(self) -> None:
        while self.pending < self._bound and self._short:
            if self._grant(self._short.popleft()):
                self.pending += 1
        while self.pending < self._bound and self.receives < self._receive_bound and self._long:
            if self._grant(self._long.popleft()):
                self.pending += 1
                self.receives += 1

    def _grant(self, future: asyncio.Future[None]) -> bool:
        if future.done():
            self._gone = max(0, self._gone - 1)
            return False
        future.set_result(None)
        return True

    def fail_all(self, error: BaseException) -> None:
        """The stream ended: each caller waiting fails with its own copy of `error`."""
        queued, self._short, self._long = [*self._short, *self._long], deque(), deque()
        self._gone = 0
        for future in queued:
            if not future.done():
                future.set_exception(copy.copy(error))
