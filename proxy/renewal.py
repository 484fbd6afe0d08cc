"""Renewal of auto_renew deliveries while their client is alive (RocketMQ's ReceiptHandleProcessor).

A PushConsumer receives with ``auto_renew`` and no invisible duration, caches up to 1,024 messages
and consumes them at its own pace: the proxy keeps them invisible until the client acks them. It
renews them at their broker with the broker's `Renew` (the same receipt handle stays valid: the client
never learns of it), every quarter of the invisible time, to another whole invisible time.

`RenewalBook` is the pure part, without clock or sockets: per client, the handles it was given with
their next renewal time, and which clients are alive (a Heartbeat or ReceiveMessage from it within `alive_s`, or
within `stream_alive_s` while a Telemetry stream of it is open on this proxy, as RocketMQ's proxy counts a client alive
while its heartbeats come).
With accounts, a client is its id as used by one account (`owner`): another account sending the same id neither ends
nor keeps alive what it holds.
`Renewer` is its asyncio driver: a tick sends the due handles to their brokers in batches.

Nothing here is needed for correctness, only to spare redeliveries: a proxy restart loses the book, and
the messages then time out and are redelivered at the end of their invisible time (docs/PROXY.md "auto_renew").
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors, validation
from popgate_contract.receipt import broker_of
from proxy.ports import BackgroundTask, Metrics, NoMetrics
from proxy.routing import BrokerPool

log = logging.getLogger(__name__)

MAX_RENEW_BATCH = validation.MAX_HANDLES  # handles per broker Renew (the broker's limit a call)
MAX_TICK_S = 1.0
RENEWALS_PER_INVISIBLE = 4  # renewed every quarter of the invisible time: a failed call has two more tries left
CLEAR_INVISIBLE_MS = 1000  # a terminated client's handles: visible again this soon (invisibleTimeMillisWhenClear)
MAX_HEARD = 100_000  # client ids remembered as heard from (ids are the client's own: bounded)


def owner(client: str, account: str) -> str:
    """Whom the book's entries belong to: the client id, qualified by the caller's access key when accounts are on.
    gRPC metadata values hold no newline, so the key and the id are told apart whatever they are."""
    return f"{account}\n{client}" if account and client else client


def renewal_period_s(invisible_s: float) -> float:
    """How often a handle given `invisible_s` is renewed. Every quarter: after a renewal at r (deadline r + T) the
    tries come at r + T/4, T/2, 3T/4 (each a tick late at most), so a call failing at r + T/4 has two more before
    the deadline. Every third left only one: the third try, a few ticks late, came after the deadline."""
    return invisible_s / RENEWALS_PER_INVISIBLE


@dataclass(frozen=True, slots=True)
class RenewalLimits:
    period_s: float  # renew this long after the receive, and after each renewal
    max_renew_s: float = 3 * 3600.0  # no renewal after this long since the receive (RocketMQ's renewMaxTimeMillis)
    max_per_client: int = 10_000  # handles tracked per client id; beyond: not renewed
    max_total: int = 200_000  # handles tracked in all; beyond: not renewed
    alive_s: float = 30.0  # a client heard from (Heartbeat, ReceiveMessage) is alive this long: 3 of the official
    # clients' heartbeats (every 10 s)
    stream_alive_s: float = 120.0  # as long with a Telemetry stream open here: RocketMQ's proxy drops a client's
    # channel after 120 s without a heartbeat, open or not — a frozen process keeps its stream open


@dataclass(slots=True)
class Tracked:
    handle: str
    client: str
    group: str
    broker: str
    due: float  # next renewal (loop time)
    until: float  # no renewal after this
    live: bool = True  # False once forgotten: its place in the due queue is skipped


@dataclass(slots=True)
class Due:
    """What `RenewalBook.take_due` hands the driver: handles to renew by (broker, group), and how many
    stopped being renewed, by reason (max_time, client_gone)."""

    batches: dict[tuple[str, str], list[str]]
    ended: Counter[str]


class RenewalBook:
    """Per client id, the auto_renew handles it holds and their next renewal time. O(1) per handle for
    tracking and forgetting; one due queue, kept in due order without a heap because every renewal is
    `period_s` after its receive or its last renewal."""

    def __init__(self, limits: RenewalLimits) -> None:
        self.limits = limits
        self._streams: dict[str, int] = {}  # client id -> Telemetry streams open on this proxy
        self._heard: OrderedDict[str, float] = OrderedDict()  # client id -> when last heard from, oldest first
        self._clients: dict[str, dict[str, Tracked]] = {}  # client id -> its handles
        self._handles: dict[str, Tracked] = {}
        self._queue: deque[Tracked] = deque()  # due order; forgotten entries skipped lazily
        self._dead = 0  # forgotten entries still in `_queue`

    def __len__(self) -> int:
        return len(self._handles)

    def alive(self, client: str, now: float) -> bool:
        """Heard from within `alive_s`, or within `stream_alive_s` with a Telemetry stream open here: an open stream
        alone is no sign of life (tests/unit/proxy/test_renewal.py::
        test_a_client_with_its_stream_open_but_silent_for_stream_alive_s_is_gone)."""
        at = self._heard.get(client)
        return at is not None and now - at < self._alive_s(client)

    def _alive_s(self, client: str) -> float:
        return self.limits.stream_alive_s if client in self._streams else self.limits.alive_s

    @property
    def heard_from(self) -> int:
        """Client ids remembered as heard from (bounded by MAX_HEARD; the expired leave as others come)."""
        return len(self._heard)

    def heard(self, client: str, now: float) -> None:
        """A Heartbeat or ReceiveMessage of this client came: alive for `alive_s` more. A proxy restarted under a
        running PushConsumer learns of it so, not only when the client next rebuilds its Telemetry stream (the
        official client does that only when a settings write fails: every 300 s)."""
        if not client:
            return
        heard = self._heard
        heard[client] = now
        heard.move_to_end(client)
        while heard:  # the expired and those over the bound leave from the oldest end
            oldest, at = next(iter(heard.items()))
            if now - at < self._alive_s(oldest) and len(heard) <= MAX_HEARD:
                break
            heard.popitem(last=False)

    def opened(self, client: str) -> None:
        """A Telemetry stream of this client opened: while one is open, it is alive `stream_alive_s` once heard."""
        self._streams[client] = self._streams.get(client, 0) + 1

    def closed(self, client: str) -> None:
        """One of its Telemetry streams ended. Once none is open and it is not heard from for `alive_s`, its
        handles are dropped when they next come due (`take_due`): a client rebuilding its stream keeps them."""
        left = self._streams.get(client, 0) - 1
        if left > 0:
            self._streams[client] = left
        else:
            self._streams.pop(client, None)

    def terminated(self, client: str, group: str = "") -> list[Tracked]:
        """NotifyClientTermination: drop its handles (of `group` only, when given) now; the dropped ones (to be made
        visible again soon)."""
        self._heard.pop(client, None)
        handles = self._clients.get(client, {})
        dropped = [t for t in handles.values() if not group or t.group == group]
        for tracked in dropped:
            self._remove(tracked)
        return dropped

    def track(self, client: str, group: str, handles: Iterable[tuple[str, str]], now: float) -> Counter[str]:
        """Renew these (broker, handle) pairs for `client` (the receive itself is a sign of life); how many are not
        renewed, by reason: no_client_id (the receive named no client: nobody to watch), client_limit, total_limit."""
        refused: Counter[str] = Counter()
        self.heard(client, now)
        if not self.alive(client, now):
            refused["no_client_id"] = sum(1 for _ in handles)
            return refused
        mine = self._clients.setdefault(client, {})
        limits = self.limits
        due, until = now + limits.period_s, now + limits.max_renew_s
        for broker, handle in handles:
            if handle in self._handles:
                continue
            if len(mine) >= limits.max_per_client:
                refused["client_limit"] += 1
            elif len(self._handles) >= limits.max_total:
                refused["total_limit"] += 1
            else:
                tracked = Tracked(handle, client, group, broker, due, until)
                mine[handle] = self._handles[handle] = tracked
                self._queue.append(tracked)
        if not mine:
            del self._clients[client]
        return refused

    def forget(self, handles: Iterable[str]) -> int:
        """Acked, changed or dead-lettered through this proxy, or stale at the broker: no more renewal; how many
        of them were tracked."""
        if not self._handles:  # no PushConsumer here: every ack passes through, nothing to look up
            return 0
        count = 0
        for handle in handles:
            tracked = self._handles.get(handle)
            if tracked is None:
                continue
            count += 1
            self._remove(tracked)
        return count

    def _remove(self, tracked: Tracked, *, queued: bool = True) -> None:
        mine = self._clients.get(tracked.client)
        if mine is not None:
            mine.pop(tracked.handle, None)
            if not mine:
                del self._clients[tracked.client]
        self._drop(tracked, queued=queued)

    def _drop(self, tracked: Tracked, *, queued: bool = True) -> None:
        """Out of the handle index; its entry in the due queue (`queued`) is skipped when reached."""
        del self._handles[tracked.handle]
        tracked.live = False
        if not queued:
            return
        self._dead += 1
        if self._dead > len(self._handles) + 1024:  # mostly dead: rebuild the queue (it keeps its order)
            self._queue = deque(t for t in self._queue if t.live)
            self._dead = 0

    def take_due(self, now: float) -> Due:
        """The handles due for renewal now, by (broker, group); each is due again `period_s` later. Handles past
        their `max_renew_s`, or of a client no longer alive, are dropped instead."""
        out = Due({}, Counter())
        queue, period = self._queue, self.limits.period_s
        while queue and queue[0].due <= now:
            tracked = queue.popleft()
            if not tracked.live:
                self._dead -= 1
                continue
            if tracked.until <= now or not self.alive(tracked.client, now):
                out.ended["max_time" if tracked.until <= now else "client_gone"] += 1
                self._remove(tracked, queued=False)
                continue
            out.batches.setdefault((tracked.broker, tracked.group), []).append(tracked.handle)
            tracked.due = now + period
            queue.append(tracked)
        return out


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
        """Renew what is due now, all brokers at once."""
        due = self.book.take_due(self._now())
        for reason, count in due.ended.items():
            self._ended(reason, count)
        await _per_call(due.batches, self._renew)

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
