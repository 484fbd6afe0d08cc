"""Byte budgets: memory held by requests in progress, bounded; over the bound the request is TOO_MANY_REQUESTS.

Pure bookkeeping (no I/O, no gRPC): the caller takes a request's cost when it starts holding the bytes and
gives it back when they are gone (a Send's commit settled, a Pop answer taken by its caller). As the proxy's
``max_send_bytes``: one request alone always fits, so a request the gRPC limit let in is never refused for
being large, only for coming while others hold the budget.
"""

from __future__ import annotations

from popgate_contract.errors import TooManyRequests


class ByteBudget:
    __slots__ = ("limit", "used", "_what", "_setting")

    def __init__(self, limit: int, *, what: str, setting: str) -> None:
        """what: the bytes counted, as an error message says it ("bytes of sends in flight");
        setting: the flag that sets `limit`, named in the error."""
        self.limit = limit
        self.used = 0
        self._what = what
        self._setting = setting

    def fits(self, cost: int) -> bool:
        return not self.used or self.used + cost <= self.limit

    def take(self, cost: int) -> int:
        """Count `cost` bytes; TooManyRequests when they do not fit. Returns `cost` (for the matching `give`)."""
        if self.used and self.used + cost > self.limit:
            raise self.refusal(cost)
        self.used += cost
        return cost

    def give(self, cost: int) -> None:
        self.used -= cost

    def full(self) -> bool:
        """Nothing more fits (checked before work whose cost is known only once it is done)."""
        return self.used >= self.limit

    def refusal(self, cost: int = 0) -> TooManyRequests:
        more = f": {cost} more do not fit" if cost else ""
        return TooManyRequests(
            f"the broker already holds {self.used} {self._what} ({self._setting} {self.limit}){more}"
        )
