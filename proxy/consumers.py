"""The consumers this proxy serves, and their report to every broker (docs/PROXY.md, "Live consumers").

A proxy knows only its own clients, and proxies are stateless and many: so each reports its live consumers to
every broker every REPORT_INTERVAL_S (at once, within a second, when it sees a new one), and a broker keeps a
proxy's last report until a report's time to live (REPORT_TTL_S) passes without a new one (broker.consumers). The
admin service's ListConsumers then asks the brokers, and any proxy answers the same. A consumer is live while
seen within LIVE_S: a Heartbeat (the official clients send one every 10 s), a receive, NotifyClientTermination
ending it at once. Liveness is measured on the monotonic clock, so a step of the wall clock neither keeps a gone
consumer live nor ends a live one; the wall time it was last seen is only shown. `ConsumerBook` is pure (its
monotonic clock injected: tests/unit/proxy/test_consumers.py); `ConsumerReporter` sends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.ports import BackgroundTask
from proxy.routing import BrokerPool

log = logging.getLogger(__name__)

LIVE_S = 30.0
MAX_CONSUMERS = 10_000  # (group, client) pairs kept, the oldest seen dropped first; a broker takes as many a report
REPORT_INTERVAL_S = 5.0
REPORT_TTL_S = 3 * REPORT_INTERVAL_S
NEW_REPORT_DELAY_S = 1.0  # a new consumer is reported within this, not at the next interval


class ConsumerBook:
    def __init__(
        self,
        *,
        live_s: float = LIVE_S,
        max_consumers: int = MAX_CONSUMERS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._live_s = live_s
        self._max = max_consumers
        self._monotonic = monotonic
        # (group, client id) -> (when last seen on the monotonic clock, the wall time then in ms), oldest first
        self._seen: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()
        self.changed = False  # a consumer not in the last report was seen, or one left

    def seen(self, client_id: str, group: str, now_ms: int) -> None:
        """The client was seen now; `now_ms` (wall time) is what is shown as its last sighting."""
        if not client_id or not group:
            return
        key = (group, client_id)
        if key not in self._seen:
            self.changed = True
        self._seen[key] = (self._monotonic(), now_ms)
        self._seen.move_to_end(key)
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)

    def gone(self, client_id: str, group: str = "") -> None:
        """The client ended (NotifyClientTermination): not live any more, in `group` only when one is named."""
        for key in [k for k in self._seen if k[1] == client_id and (not group or k[0] == group)]:
            del self._seen[key]
            self.changed = True

    def live(self) -> list[bpb.Consumer]:
        """Consumers seen within LIVE_S, the others forgotten."""
        now = self._monotonic()
        while self._seen:
            key, (last, _) = next(iter(self._seen.items()))
            if now - last <= self._live_s:
                break
            del self._seen[key]
        return [bpb.Consumer(group=g, client_id=c, last_seen_ms=t) for (g, c), (_, t) in self._seen.items()]


def wall_ms() -> int:
    return int(time.time() * 1000)


class ConsumerReporter(BackgroundTask):
    """Reports the book to every live broker every REPORT_INTERVAL_S, and within NEW_REPORT_DELAY_S of a change."""

    def __init__(self, book: ConsumerBook, pool: BrokerPool, proxy: str, *, timeout_s: float) -> None:
        self._book = book
        self._pool = pool
        self._proxy = proxy
        self._timeout_s = timeout_s

    async def __aenter__(self) -> ConsumerReporter:
        self._task = asyncio.create_task(self._run())
        return self

    async def report(self) -> None:
        self._book.changed = False
        request = bpb.ReportConsumersRequest(
            proxy=self._proxy, consumers=self._book.live(), ttl_ms=int(REPORT_TTL_S * 1000)
        )
        calls = [c.admin("ReportConsumers", request, timeout_s=self._timeout_s) for c in self._pool.live()]
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(outcome, errors.DomainError):
                log.debug("consumer report failed: %s", outcome.message)
            elif isinstance(outcome, BaseException):
                raise outcome

    async def reported_elsewhere(self, group: str) -> set[str] | None:
        """The client ids of `group` that other proxies report live (proxy.renewal asks about the clients it renews
        for that this proxy no longer hears from). Every broker holds every proxy's report: the first live one that
        answers is asked, two at most; None when neither did —
        tests/unit/proxy/test_admin_fanout.py::test_the_reporter_says_which_clients_of_a_group_other_proxies_report_live."""
        request = bpb.ListConsumersRequest(group=group)
        for client in self._pool.live()[:2]:
            try:
                answer = await client.admin("ListConsumers", request, timeout_s=self._timeout_s)
            except errors.DomainError as exc:
                log.debug("listing the consumers of %s failed: %s", group, exc.message)
                continue
            return {c.client_id for c in answer.consumers if c.proxy != self._proxy}
        return None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            if loop.time() >= next_at or self._book.changed:
                next_at = loop.time() + REPORT_INTERVAL_S
                try:
                    await self.report()
                except Exception:  # a bug must not stop the reports
                    log.exception("consumer report failed")
            await asyncio.sleep(NEW_REPORT_DELAY_S)
