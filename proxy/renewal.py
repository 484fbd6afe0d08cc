"""Renewal of auto_renew deliveries while their client is alive (RocketMQ's ReceiptHandleProcessor).

A PushConsumer receives with ``auto_renew`` and no invisible duration, caches up to 1,024 messages
and consumes them at its own pace: the proxy keeps them invisible until the client acks them. It
renews them at their broker with the broker's `Renew` (the same receipt handle stays valid: the client
never learns of it), every quarter of the invisible time, to another whole invisible time.

`RenewalBook` (proxy.renewal_book) is the pure part: per client, the handles it was given with their next renewal
time, and which clients are alive. `Renewer` is its asyncio driver: a tick sends the due handles to their brokers in
batches, and asks whether another proxy reports live the clients this one no longer hears from (a client whose
connection moved keeps what it received here renewed).

Nothing here is needed for correctness, only to spare redeliveries: a proxy restart loses the book, and
the messages then time out and are redelivered at the end of their invisible time (docs/PROXY.md "auto_renew").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors, validation
from popgate_contract.receipt import broker_of
from proxy.ports import BackgroundTask, Metrics, NoMetrics
from proxy.renewal_book import RenewalBook, RenewalLimits, owner
from proxy.routing import BrokerPool

log = logging.getLogger(__name__)

MAX_RENEW_BATCH = validation.MAX_HANDLES  # handles per broker Renew (the broker's limit a call)
MAX_TICK_S = 1.0
CLEAR_INVISIBLE_MS = 1000  # a terminated client's handles: visible again this soon (invisibleTimeMillisWhenClear)


class Renewer(BackgroundTask):
    """Drives a `RenewalBook`: every tick, the due handles go to their brokers as `Renew` calls of up to
    MAX_RENEW_BATCH handles; a stale answer (acked elsewhere, redelivered) drops the handle, a failed call
    leaves it for the next period (two more tries before its invisibility ends, `renewal_period_s`). Run it
    with `async with`."""

    def __init__(
        self,
        pool: BrokerPool,
        limits: RenewalLimits,
        *,
        invisible_ms: int,
        broker_timeout_s: float = 3.0,
        metrics: Metrics | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.book = RenewalBook(limits)
        self._pool = pool
        self._invisible_ms = invisible_ms
        self._timeout = broker_timeout_s
        self._metrics = metrics or NoMetrics()
        self._clock = clock
        self._metrics.watch_renewals(lambda: len(self.book))
        # `group` -> the client ids other proxies report live in it (None: no broker answered); set once the proxy
        # knows its name (proxy.consumers.ConsumerReporter.reported_elsewhere). Unset: a client unheard here is gone.
        self.elsewhere: Callable[[str], Awaitable[set[str] | None]] | None = None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    # -- what the edge and the core report ---------------------------------------------------

    # `account`: the caller's access key ("" without accounts). An id is the client only as used by that account —
    # tests/unit/proxy/test_renewal.py::test_a_client_id_under_another_account_neither_ends_nor_keeps_alive_its_handles,
    # tests/integration/proxy/test_client_accounts.py.

    def opened(self, client: str, *, account: str = "") -> None:
        if client:
            self.book.opened(owner(client, account))

    def closed(self, client: str, *, account: str = "") -> None:
        if client:
            self.book.closed(owner(client, account))

    def heard(self, client: str, *, account: str = "") -> None:
        """A Heartbeat of this client came (`RenewalBook.heard`)."""
        if self.book.limits.max_total:  # renewal on
            self.book.heard(owner(client, account), self._now())

    async def terminated(self, client: str, *, account: str = "", group: str = "") -> None:
        """NotifyClientTermination: the client's auto_renew handles are renewed to `CLEAR_INVISIBLE_MS` (RocketMQ's
        proxy sets them to 1 s when a client goes): what it held and did not settle is delivered again in a
        second, not at the end of its invisible time, and a FIFO message group behind one does not wait for that —
        tests/unit/proxy/test_renewal.py::test_a_terminated_clients_handles_are_made_visible_again_in_a_second,
        tests/integration/proxy/test_termination.py. With accounts, only the handles of `group` when one is named
        (RocketMQ's proxy clears a client's handles by group); without, every handle of the id, as always."""
        if not client:
            return
        dropped = self.book.terminated(owner(client, account), group if account else "")
        self._ended("client_gone", len(dropped))
        batches: dict[tuple[str, str], list[str]] = {}
        for tracked in dropped:
            batches.setdefault((tracked.broker, tracked.group), []).append(tracked.handle)
        await _per_call(batches, self._clear)

    async def _clear(self, broker: str, group: str, handles: list[str]) -> None:
        client = self._pool.get(broker)
        if client is None:
            return
        request = bpb.RenewRequest(
            group=group, receipt_handles=handles, invisible_ms=CLEAR_INVISIBLE_MS, bring_forward=True
        )
        try:
            await client.renew(request, timeout_s=self._timeout)
        except errors.DomainError as exc:  # they come back at the end of their invisible time instead
            log.info(
                "giving back %d handle(s) of a terminated client at broker %s failed: %s", len(handles), broker, exc
            )

    def track(self, client: str, group: str, handles: Sequence[str], *, account: str = "") -> None:
        """Renew these handles of an auto_renew receive while `client` is alive (called before they are written
        to it, so an ack cannot come first)."""
        if not self.book.limits.max_total:  # renewal off (--renew-max-handles 0)
            return
        pairs = []
        for h in handles:
            try:
                pairs.append((broker_of(h), h))
            except errors.InvalidReceiptHandle:  # a broker's own handles are well-formed; never fail a receive
                continue
        for reason, count in self.book.track(owner(client, account), group, pairs, self._now()).items():
            self._metrics.renewal_untracked(reason, count)

    def forget(self, handles: Iterable[str]) -> None:
        """Acked, changed or dead-lettered through this proxy (whatever the broker answers)."""
        self._ended("settled", self.book.forget(handles))

    def _ended(self, reason: str, count: int) -> None:
        if count:
            self._metrics.renewal_ended(reason, count)

    # -- the tick ---------------------------------------------------------------------------

    async def renew_due(self) -> None:
        """Renew what is due now, all brokers at once; meanwhile ask, once per group, whether other proxies report
        live the clients unheard here (tests/unit/proxy/test_renewal.py::
        test_a_client_another_proxy_reports_live_keeps_what_it_received_here_renewed)."""
        due = self.book.take_due(self._now(), ask=self.elsewhere is not None)
        for reason, count in due.ended.items():
            self._ended(reason, count)
        reported, _ = await asyncio.gather(self._reported(list(due.asks)), _per_call(due.batches, self._renew))
        self._ended("client_gone", self.book.answered(due.asks, reported, self._now()))

    async def _reported(self, groups: list[str]) -> dict[str, set[str] | None]:
        if not groups or self.elsewhere is None:
            return {}
        return dict(zip(groups, await asyncio.gather(*map(self.elsewhere, groups)), strict=True))

    async def _renew(self, broker: str, group: str, handles: list[str]) -> None:
        client = self._pool.get(broker)
        if client is None:  # not a broker of this proxy (cannot happen for handles it received): stop
            self._ended("stale", self.book.forget(handles))
            return
        request = bpb.RenewRequest(group=group, receipt_handles=handles, invisible_ms=self._invisible_ms)
        try:
            response = await client.renew(request, timeout_s=self._timeout)
        except errors.DomainError as exc:
            log.info(
                "renewing %d handle(s) at broker %s failed (tried again next period): %s", len(handles), broker, exc
            )
            self._metrics.renewals("failed", len(handles))
            return
        stale: list[str] = []
        failed = 0
        for handle, result in zip(handles, response.results, strict=False):
            if result.ok:
                continue
            if result.error == errors.InvalidReceiptHandle.__name__:
                stale.append(handle)
            else:
                failed += 1
        failed += max(0, len(handles) - len(response.results))
        ok = len(handles) - len(stale) - failed
        for outcome, count in (("ok", ok), ("stale", len(stale)), ("failed", failed)):
            if count:
                self._metrics.renewals(outcome, count)
        self._ended("stale", self.book.forget(stale))

    async def _run(self, tick_s: float) -> None:
        while True:
            await asyncio.sleep(tick_s)
            try:
                await self.renew_due()
            except Exception:  # a bug must not end renewal for the proxy's life
                log.exception("renewal tick failed")

    async def __aenter__(self) -> Renewer:
        if not self.book.limits.max_total:  # renewal off: nothing is ever tracked
            return self
        tick_s = min(MAX_TICK_S, self.book.limits.period_s / 4)
        self._task = asyncio.get_running_loop().create_task(self._run(tick_s), name="renewal")
        return self


async def _per_call(
    batches: dict[tuple[str, str], list[str]], call: Callable[[str, str, list[str]], Awaitable[None]]
) -> None:
    """`call(broker, group, handles)` for every (broker, group) batch, MAX_RENEW_BATCH handles a call, all at once."""
    calls = [
        call(broker, group, handles[start : start + MAX_RENEW_BATCH])
        for (broker, group), handles in batches.items()
        for start in range(0, len(handles), MAX_RENEW_BATCH)
    ]
    if calls:
        await asyncio.gather(*calls)
