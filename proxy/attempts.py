"""A consumer group's max delivery attempts as its brokers have it, for the Telemetry answers.

As RocketMQ's proxy reads a subscription group's retryMaxTimes from the broker and answers clients
``max_attempts = retryMaxTimes + 1``, this one asks each live broker's GroupConfig: the broker's
--group-max-attempts for the group, otherwise its --max-delivery-attempts. The official clients act on the
number (a FIFO PushConsumer retries a message locally that many times, then forwards it to the DLQ) and wait
for the Telemetry answer, so a lookup takes at most its timeout; its answer is kept `ttl_s` for at most
`max_groups` groups, and concurrent lookups of one group share one. When no broker answers in time the
number is DEFAULT_MAX_ATTEMPTS (RocketMQ's 17), kept for nobody: the next Telemetry asks again.

Brokers that disagree (a rolling change of their flags): the largest number. A client then never
dead-letters a message before its broker would; a broker with a lower limit still dead-letters its messages
at that limit, when a redelivery comes due (a nack is one), and only a FIFO PushConsumer's local retries go
past it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from proxy.ports import BrokerClient

log = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 17  # RocketMQ: retryMaxTimes 16 + 1, the brokers' default --max-delivery-attempts
LOOKUP_TIMEOUT_S = 1.0  # at most this for an answer (also within --broker-timeout-s)
TTL_S = 30.0  # an answer is used this long: a broker's changed setting reaches new Telemetry answers after it
MAX_GROUPS = 10_000  # groups kept; past it the oldest answer goes


class GroupAttempts:
    def __init__(
        self,
        brokers: Callable[[], Sequence[BrokerClient]],
        *,
        timeout_s: float = LOOKUP_TIMEOUT_S,
        ttl_s: float = TTL_S,
        max_groups: int = MAX_GROUPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._brokers = brokers  # the ones to ask (the live ones)
        self._timeout = timeout_s
        self._ttl = ttl_s
        self._max_groups = max_groups
        self._clock = clock
        self._known: dict[str, tuple[float, int]] = {}  # group -> (good until, attempts), oldest first
        self._asking: dict[str, asyncio.Future[int | None]] = {}  # group -> its lookup under way

    async def of(self, group: str) -> int:
        """The group's max delivery attempts (`group` as stored: ``namespace%name`` in a namespace)."""
        known = self._known.get(group)
        if known is not None and known[0] > self._clock():
            return known[1]
        lookup = self._asking.get(group)
        if lookup is None:
            lookup = self._asking[group] = asyncio.ensure_future(self._ask(group))
        answer = await asyncio.shield(lookup)  # a Telemetry stream that goes away leaves it to the others
        return DEFAULT_MAX_ATTEMPTS if answer is None else answer

    async def _ask(self, group: str) -> int | None:
        """The largest answer of the brokers that answer in time; None when none does."""
        try:
            brokers = self._brokers()
            calls = [asyncio.ensure_future(b.group_config(group, timeout_s=self._timeout)) for b in brokers]
            if calls:
                await asyncio.wait(calls, timeout=self._timeout)
            answers = []
            for broker, call in zip(brokers, calls, strict=True):
                if not call.done():
                    call.cancel()
                elif call.exception() is not None:
                    log.debug("broker %s: no max attempts for group %s: %s", broker.name, group, call.exception())
                else:
                    answers.append(call.result().max_delivery_attempts)
            if not answers:
                return None
            largest = max(answers)
            self._keep(group, largest)
            return largest
        finally:
            del self._asking[group]

    def _keep(self, group: str, attempts: int) -> None:
        self._known.pop(group, None)
        while len(self._known) >= self._max_groups:
            del self._known[next(iter(self._known))]
        self._known[group] = (self._clock() + self._ttl, attempts)
