"""What the protocol-neutral core needs from the outside: broker clients and a metrics sink.

The core talks to brokers only through `BrokerClient`; `proxy.brokers` implements it
over gRPC, unit tests with in-memory fakes. Messages are the broker protocol's
types (popgate_pb.broker_pb2): the backend's data model, not a transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors

if TYPE_CHECKING:
    from proxy.outgoing import Chunk
    from proxy.receive.notify import RunStats


class BrokerClient(Protocol):
    """One broker. Methods raise popgate_contract.errors.DomainError subclasses (BrokerUnavailable when unreachable)."""

    @property
    def name(self) -> str: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def recoveries(self) -> int:
        """How many times the health checks saw the broker come back up (a count to compare, not a time)."""

    def when_up(self) -> asyncio.Future[None]:
        """Done once the broker's health checks see it up: at once if they do now (a notify run waits on it)."""

    async def send(self, chunk: Chunk, *, timeout_s: float) -> Sequence[bpb.SendResult]:
        """Store a chunk's messages (proxy.outgoing): their results, in the chunk's answer order."""

    async def ack(self, request: bpb.AckRequest, *, timeout_s: float) -> bpb.AckResponse: ...

    async def change_invisible_time(
        self, request: bpb.ChangeInvisibleTimeRequest, *, timeout_s: float
    ) -> bpb.ChangeInvisibleTimeResponse: ...

    async def change_invisible_times(
        self, request: bpb.ChangeInvisibleTimesRequest, *, timeout_s: float
    ) -> list[str | errors.DomainError]:
        """ChangeInvisibleTime of each handle: per handle in order its new receipt handle or its error (one commit at a
        broker that takes them at once)."""

    async def dead_letter(self, request: bpb.DeadLetterRequest, *, timeout_s: float) -> bpb.DeadLetterResponse: ...

    async def renew(self, request: bpb.RenewRequest, *, timeout_s: float) -> bpb.RenewResponse:
        """Extend in-flight deliveries, their receipt handles unchanged (proxy.renewal)."""

    async def group_config(self, group: str, *, timeout_s: float) -> bpb.GroupConfigResponse:
        """The consumer group's settings at this broker: its max delivery attempts (proxy.attempts)."""

    async def stats(self, request: bpb.StatsRequest, *, timeout_s: float) -> bpb.StatsResponse:
        """Lag and stored counts (the admin service, proxy.admin)."""

    async def list_messages(self, request: bpb.ListMessagesRequest, *, timeout_s: float) -> bpb.ListMessagesResponse:
        """A page of a queue's stored messages (the admin service, proxy.admin)."""

    async def admin(self, method: str, request: Any, *, timeout_s: float) -> Any:
        """One of the broker's unary admin RPCs by name (ResetOffset, DeleteGroup, ...: proxy.admin)."""

    async def recall(self, request: bpb.RecallRequest, *, timeout_s: float) -> bpb.RecallResponse:
        """Withdraw a scheduled message (proxy.producer)."""

    async def end_transaction(
        self, request: bpb.EndTransactionRequest, *, timeout_s: float
    ) -> bpb.EndTransactionResponse:
        """Commit or roll back a half message (proxy.producer)."""

    async def transaction_checks(
        self, request: bpb.TransactionChecksRequest, *, timeout_s: float
    ) -> bpb.TransactionChecksResponse:
        """The half messages due for a check back (proxy.txchecks)."""

    # Pop and Notification are started at once and return futures: cancelling one cancels the broker
    # request. A held receive waits on one per broker, so no task or coroutine per request.
    def begin_pop(self, request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]: ...

    def release(self, call: asyncio.Future[Any]) -> None:
        """An answer nobody will use: a `begin_pop`'s messages, ready again at the broker; a `begin_notification`'s
        has_message, its wake passed on to another request held there."""

    def begin_notification(
        self, request: bpb.NotificationRequest, *, timeout_s: float
    ) -> asyncio.Future[bpb.NotificationResponse]: ...


class Health:
    """Whether a broker is up as its health checks see it, and one future for everyone waiting for it to be up."""

    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.recoveries = 0  # down -> up changes seen
        self._when_up: asyncio.Future[None] | None = None  # done while up, pending while down (made on demand)

    def set(self, up: bool) -> bool:
        """Record what a check saw; whether that changed anything."""
        if up == self.up:
            return False
        self.up = up
        self.recoveries += up
        if up and self._when_up is not None and not self._when_up.done():
            self._when_up.set_result(None)
        elif not up:
            self._when_up = None  # the next when_up() waits for the broker to come back
        return True

    def wake(self) -> None:
        """Wake everyone waiting for the broker to be up, whatever it is now: its client was replaced or retired,
        and they look at the pool's client of its name again. A later `when_up` waits afresh."""
        if self._when_up is not None and not self._when_up.done():
            self._when_up.set_result(None)
            self._when_up = None

    def when_up(self) -> asyncio.Future[None]:
        if self._when_up is None:
            self._when_up = asyncio.get_running_loop().create_future()
            if self.up:
                self._when_up.set_result(None)
        return self._when_up


class HeldPop(Protocol):
    moved_to: str | None  # set when the Pop was cancelled to be made at this broker instead


class HeldPops(Protocol):
    """The adaptive mode's count of a group's held Pops per broker (`proxy.receive.coupled.LongPollStrategy` with
    cover), keyed by (topic, group, filter): a Pop tracked there is covered by watches at the other brokers and may
    be moved to one of them."""

    def track(self, key: tuple[str, str, str], broker: str, call: asyncio.Future[Any]) -> HeldPop: ...

    def untrack(self, key: tuple[str, str, str], broker: str, entry: HeldPop) -> None: ...


class Metrics(Protocol):
    """Where the proxy reports what it did (Prometheus in production, nothing in unit tests)."""

    def rpc(self, method: str, code: str, seconds: float) -> None: ...

    def broker_rpc(self, broker: str, method: str, outcome: str) -> None: ...

    def receive(self, group: str, mode: str, outcome: str, seconds: float, *, request: object = None) -> None:
        """A receive ended; `request` is the one its `mode_decision` named (an adaptive receive)."""

    def long_poll(self, group: str) -> None:
        """A receive a broker held (is_long_polling); once a receive."""

    def first_pop_hit(self, group: str) -> None:
        """A receive whose first Pop found messages without being held (is_short_polling_hit)."""

    def pop_moved(self, group: str) -> None:
        """A held long-poll Pop moved to a broker with a message nobody of the group waited for there."""

    def answer_not_read(self, group: str) -> None:
        """An answer's client did not read it within max_answer_write_s: its messages were given back."""

    def notify_run(self, group: str, stats: RunStats, outcome: str) -> None: ...

    def mode_decision(self, group: str, mode: str, reason: str, *, request: object) -> None: ...

    def renewals(self, outcome: str, count: int) -> None:
        """Handles sent to brokers for renewal, by outcome: ok, stale, failed."""

    def renewal_untracked(self, reason: str, count: int) -> None:
        """auto_renew handles not renewed at all: no_client_id, client_limit, total_limit."""

    def renewal_ended(self, reason: str, count: int) -> None:
        """Handles no longer renewed: settled, stale, max_time, client_gone."""

    def watch_renewals(self, tracked: Callable[[], int]) -> None:
        """`tracked()` is the number of handles being renewed now (read at each scrape)."""


class NoMetrics:
    def rpc(self, method: str, code: str, seconds: float) -> None:
        pass

    def broker_rpc(self, broker: str, method: str, outcome: str) -> None:
        pass

    def receive(self, group: str, mode: str, outcome: str, seconds: float, *, request: object = None) -> None:
        pass

    def long_poll(self, group: str) -> None:
        pass

    def first_pop_hit(self, group: str) -> None:
        pass

    def pop_moved(self, group: str) -> None:
        pass

    def answer_not_read(self, group: str) -> None:
        pass

    def notify_run(self, group: str, stats: RunStats, outcome: str) -> None:
        pass

    def mode_decision(self, group: str, mode: str, reason: str, *, request: object) -> None:
        pass

    def renewals(self, outcome: str, count: int) -> None:
        pass

    def renewal_untracked(self, reason: str, count: int) -> None:
        pass

    def renewal_ended(self, reason: str, count: int) -> None:
        pass

    def watch_renewals(self, tracked: Callable[[], int]) -> None:
        pass


class BackgroundTask:
    """A task of the proxy's life (health checks, renewal) started by its `__aenter__` into `_task`, cancelled and
    awaited on exit."""

    _task: asyncio.Task[None] | None = None

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
