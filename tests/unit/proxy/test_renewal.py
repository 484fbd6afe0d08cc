"""Renewal of auto_renew handles without sockets: the pure book (who is alive, what is due, the bounds, when renewal
stops) and its driver over in-memory brokers (batches, stale answers, failures)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest

from popgate_contract import errors
from proxy.renewal import CLEAR_INVISIBLE_MS, MAX_RENEW_BATCH, Renewer
from proxy.renewal_book import RenewalBook, RenewalLimits
from proxy.routing import BrokerPool
from tests.unit.proxy.fakes import FakeBroker, handle

pytestmark = pytest.mark.timeout(10)  # a driver test that hangs fails here, not at the suite's per-test bound
PERIOD = 20.0


def book(**limits: float) -> RenewalBook:
    return RenewalBook(RenewalLimits(period_s=PERIOD, **limits))  # type: ignore[arg-type]


def pairs(*tokens: str, broker: str = "b1") -> list[tuple[str, str]]:
    return [(broker, handle(broker, token=t)) for t in tokens]


def test_a_receive_that_names_no_client_is_not_renewed() -> None:
    b = book()
    assert b.track("", "g", pairs("a1", "a2"), now=0) == Counter(no_client_id=2)
    assert len(b) == 0
    assert b.take_due(100).batches == {}


def test_a_client_without_a_telemetry_stream_here_is_alive_while_it_is_heard_from() -> None:
    """A proxy restarted under a running PushConsumer has no stream of it until the client rebuilds one (every
    300 s at most): its receives and heartbeats keep it alive instead (30 s after the last)."""
    b = book(alive_s=30)
    assert not b.track("c1", "g", pairs("a1"), now=0)  # the receive itself is a sign of life
    assert b.take_due(20).batches  # heard 20 s ago: renewed
    b.heard("c1", now=35)  # a heartbeat
    assert b.take_due(40).batches and b.alive("c1", now=64.9)
    due = b.take_due(65)  # 30 s without a word: gone
    assert due.batches == {} and due.ended == Counter(client_gone=1) and not b.alive("c1", now=65)


def test_clients_heard_from_are_bounded_and_forgotten_once_expired() -> None:
    b = book(alive_s=30)
    for i in range(1000):
        b.heard(f"c{i}", now=i / 100)
    assert b.alive("c0", now=10) and b.alive("c999", now=10)
    b.heard("late", now=40)  # every earlier one expired: forgotten as this one is recorded
    assert b.heard_from == 1


def test_handles_come_due_after_each_period_by_broker_and_group() -> None:
    b = book()
    b.opened("c1")
    assert not b.track("c1", "g", pairs("a1", "a2"), now=0)
    assert not b.track("c1", "g", pairs("b1", broker="b2"), now=1)
    assert not b.track("c1", "h", pairs("c1"), now=2)
    assert len(b) == 4
    assert b.take_due(19.9).batches == {}
    due = b.take_due(20)
    assert due.batches == {("b1", "g"): [handle("b1", token="a1"), handle("b1", token="a2")]}
    assert set(b.take_due(22).batches) == {("b2", "g"), ("b1", "h")}
    assert b.take_due(39).batches == {}
    assert len(b.take_due(40).batches[("b1", "g")]) == 2  # renewed again a period after the renewal


def test_forgotten_handles_are_not_renewed_and_repeated_ones_tracked_once() -> None:
    b = book()
    b.opened("c1")
    b.track("c1", "g", pairs("a1", "a2", "a3"), now=0)
    b.track("c1", "g", pairs("a1"), now=5)
    assert len(b) == 3
    assert b.forget([handle("b1", token="a2"), handle("b1", token="zz")]) == 1
    assert b.take_due(20).batches == {("b1", "g"): [handle("b1", token="a1"), handle("b1", token="a3")]}
    assert len(b) == 2


def test_many_forgotten_handles_leave_the_due_queue_in_order() -> None:
    b = book()
    b.opened("c1")
    tokens = [f"{i:x}" for i in range(1, 5001)]
    for i, token in enumerate(tokens):
        b.track("c1", "g", pairs(token), now=i / 1000)
    b.forget(handle("b1", token=t) for t in tokens[:4000])  # past the compaction threshold
    due = b.take_due(30).batches[("b1", "g")]
    assert due == [handle("b1", token=t) for t in tokens[4000:]]


def test_bounds_per_client_and_in_total() -> None:
    b = book(max_per_client=3, max_total=5)
    b.opened("c1")
    b.opened("c2")
    assert b.track("c1", "g", pairs("a1", "a2", "a3", "a4"), now=0) == Counter(client_limit=1)
    assert b.track("c2", "g", pairs("b1", "b2", "b3"), now=0) == Counter(total_limit=1)
    assert len(b) == 5
    b.forget([handle("b1", token="a1")])
    assert not b.track("c2", "g", pairs("b3"), now=0)  # room again
    assert len(b) == 5


def test_renewal_stops_after_the_maximum_time() -> None:
    b = book(max_renew_s=50)
    b.opened("c1")
    b.track("c1", "g", pairs("a1"), now=0)
    assert b.take_due(20).batches and b.take_due(40).batches
    due = b.take_due(60)
    assert due.batches == {} and due.ended == Counter(max_time=1)
    assert len(b) == 0


def test_a_client_whose_stream_closed_is_dropped_at_its_next_renewal_unless_it_reopened() -> None:
    b = book()
    b.opened("gone")
    b.opened("back")
    b.opened("twice")
    b.opened("twice")
    for client in ("gone", "back", "twice"):
        b.track(client, client, [("b1", handle("b1", token=client.encode().hex()))], now=0)
    b.closed("gone")
    b.closed("back")
    b.opened("back")  # the official client rebuilds its stream: close, then open
    b.closed("twice")  # one of its two streams
    assert set(b.take_due(20).batches) == {("b1", "gone"), ("b1", "back"), ("b1", "twice")}  # heard 20 s ago
    due = b.take_due(40)  # and not since: gone
    assert set(due.batches) == {("b1", "back"), ("b1", "twice")}
    assert due.ended == Counter(client_gone=1)
    assert not b.alive("gone", now=40) and b.alive("twice", now=40)


def test_a_client_with_its_stream_open_but_silent_for_stream_alive_s_is_gone() -> None:
    """A stopped, deadlocked or cut-off process keeps its Telemetry stream open (no TCP reset): what it holds is
    redelivered once it is silent `stream_alive_s` (RocketMQ's client expiry), not when keepalive ends the stream."""
    b = book(alive_s=30)
    assert b.limits.stream_alive_s == 120
    for client in ("frozen", "beating"):
        b.opened(client)
        b.track(client, client, [("b1", handle("b1", token=client.encode().hex()))], now=0)
    for second in range(20, 101, 20):  # past alive_s: its open stream keeps it alive, up to stream_alive_s
        b.heard("beating", now=second - 5)  # its heartbeats come; the frozen one's do not
        assert set(b.take_due(second).batches) == {("b1", "frozen"), ("b1", "beating")}, second
    b.heard("beating", now=115)
    due = b.take_due(120)
    assert set(due.batches) == {("b1", "beating")} and due.ended == Counter(client_gone=1)
    assert not b.alive("frozen", now=120) and b.alive("beating", now=120)


def test_termination_drops_the_clients_handles_at_once() -> None:
    b = book()
    b.opened("c1")
    b.opened("c2")
    b.track("c1", "g", pairs("a1", "a2"), now=0)
    b.track("c2", "g", pairs("b1"), now=0)
    assert sorted(t.handle for t in b.terminated("c1")) == sorted(h for _, h in pairs("a1", "a2"))
    assert len(b) == 1
    assert b.take_due(20).batches == {("b1", "g"): [handle("b1", token="b1")]}


class Recorder:
    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.tracked: Callable[[], int] = lambda: -1

    def renewals(self, outcome: str, count: int) -> None:
        self.counts[("renewals", outcome)] += count

    def renewal_untracked(self, reason: str, count: int) -> None:
        self.counts[("untracked", reason)] += count

    def renewal_ended(self, reason: str, count: int) -> None:
        self.counts[("ended", reason)] += count

    def watch_renewals(self, tracked: Callable[[], int]) -> None:
        self.tracked = tracked


def renewer(brokers: list[FakeBroker], clock: list[float], metrics: Recorder) -> Renewer:
    pool = BrokerPool({b.name: b for b in brokers})
    limits = RenewalLimits(period_s=PERIOD)
    return Renewer(pool, limits, invisible_ms=60_000, metrics=metrics, clock=lambda: clock[0])  # type: ignore[arg-type]


async def test_due_handles_go_to_their_brokers_in_batches_and_stale_ones_are_dropped() -> None:
    b1, b2 = FakeBroker("b1"), FakeBroker("b2")
    clock, metrics = [0.0], Recorder()
    r = renewer([b1, b2], clock, metrics)
    r.opened("c1")
    many = [handle("b1", token=f"{i + 1:x}") for i in range(MAX_RENEW_BATCH + 10)]
    r.track("c1", "g", [*many, handle("b1", token="5a1e"), handle("b2")])
    assert metrics.tracked() == MAX_RENEW_BATCH + 12
    clock[0] = PERIOD
    await r.renew_due()
    assert [len(req.receipt_handles) for req in b1.renews] == [MAX_RENEW_BATCH, 11]
    assert all(req.group == "g" and req.invisible_ms == 60_000 for req in b1.renews + b2.renews)
    assert [list(req.receipt_handles) for req in b2.renews] == [[handle("b2")]]
    assert metrics.counts[("renewals", "ok")] == MAX_RENEW_BATCH + 11
    assert metrics.counts[("renewals", "stale")] == 1
    assert metrics.counts[("ended", "stale")] == 1
    assert metrics.tracked() == MAX_RENEW_BATCH + 11  # the stale one is no longer renewed


async def test_a_failed_renewal_keeps_its_handles_for_the_next_period() -> None:
    b1 = FakeBroker("b1")
    clock, metrics = [0.0], Recorder()
    r = renewer([b1], clock, metrics)
    r.opened("c1")
    r.track("c1", "g", [handle("b1")])
    b1.fail = errors.BrokerUnavailable("down")
    clock[0] = PERIOD
    await r.renew_due()
    assert metrics.counts[("renewals", "failed")] == 1
    b1.fail = None
    clock[0] = 2 * PERIOD
    await r.renew_due()
    assert [list(req.receipt_handles) for req in b1.renews] == [[handle("b1")]]
    assert metrics.counts[("renewals", "ok")] == 1


async def test_untracked_and_settled_handles_are_counted() -> None:
    clock, metrics = [0.0], Recorder()
    r = renewer([FakeBroker("b1")], clock, metrics)
    r.track("", "g", [handle("b1", token="a1")])  # no client id
    r.opened("c1")
    r.track("c1", "g", [handle("b1", token="a2"), handle("b1", token="a3")])
    r.forget([handle("b1", token="a2")])
    await r.terminated("c1")
    r.closed("c1")
    assert metrics.counts == Counter(
        {("untracked", "no_client_id"): 1, ("ended", "settled"): 1, ("ended", "client_gone"): 1}
    )
    assert metrics.tracked() == 0


async def test_the_driver_ticks_on_its_own_until_closed() -> None:
    b1 = FakeBroker("b1")
    pool = BrokerPool({"b1": b1})
    async with Renewer(pool, RenewalLimits(period_s=0.08), invisible_ms=1000) as r:
        r.opened("c1")
        r.track("c1", "g", [handle("b1")])
        for _ in range(100):
            if len(b1.renews) >= 2:
                break
            await asyncio.sleep(0.02)
    count = len(b1.renews)
    assert count >= 2
    await asyncio.sleep(0.2)
    assert len(b1.renews) == count  # stopped


async def test_a_garbled_handle_is_skipped_not_raised() -> None:
    clock, metrics = [0.0], Recorder()
    r = renewer([FakeBroker("b1")], clock, metrics)
    r.opened("c1")
    r.track("c1", "g", ["garbage", handle("b1")])  # raising would fail the receive whose messages were popped
    result = len(r.book)
    assert result == 1


async def test_renewal_off_tracks_nothing_and_runs_no_task() -> None:
    b1, metrics = FakeBroker("b1"), Recorder()
    limits = RenewalLimits(period_s=PERIOD, max_total=0)
    async with Renewer(BrokerPool({"b1": b1}), limits, invisible_ms=60_000, metrics=metrics) as r:  # type: ignore[arg-type]
        r.opened("c1")
        r.track("c1", "g", [handle("b1")])
        assert metrics.tracked() == 0 and r._task is None
        assert not metrics.counts  # not counted as refused by a bound: off


async def test_a_terminated_clients_handles_are_made_visible_again_in_a_second() -> None:
    """RocketMQ's proxy sets a departing client's handles to 1 s: what it held unsettled (a PushConsumer shut down
    with messages its stopped pool would not take) comes back at once, not ~60 s later; another client's stay."""
    b1, b2 = FakeBroker("b1"), FakeBroker("b2")
    r = renewer([b1, b2], [0.0], Recorder())
    r.opened("c1")
    r.opened("c2")
    r.track("c1", "g", [handle("b1", token="a1"), handle("b1", token="a2"), handle("b2", token="a3")])
    r.track("c2", "g", [handle("b1", token="c2")])
    await r.terminated("c1")
    assert [(list(q.receipt_handles), q.invisible_ms, q.bring_forward) for q in b1.renews] == [
        ([handle("b1", token="a1"), handle("b1", token="a2")], CLEAR_INVISIBLE_MS, True)
    ]
    assert [list(q.receipt_handles) for q in b2.renews] == [[handle("b2", token="a3")]]
    assert len(r.book) == 1


async def test_a_client_id_under_another_account_neither_ends_nor_keeps_alive_its_handles() -> None:
    b1 = FakeBroker("b1")
    clock, metrics = [0.0], Recorder()
    r = renewer([b1], clock, metrics)
    r.track("alice@1@0@x", "billing", [handle("b1", token="a1")], account="alice")  # heard: alive for alive_s
    r.opened("alice@1@0@x", account="mallory")  # a Telemetry stream opened with her id by another key
    await r.terminated("alice@1@0@x", account="mallory")
    assert not b1.renews and metrics.tracked() == 1  # not given back: another account's id is another client
    for second in range(0, 40, 5):  # alice is gone; mallory heartbeats with her id
        clock[0] = second
        r.heard("alice@1@0@x", account="mallory")
        await r.renew_due()
    clock[0] = 45.0
    await r.renew_due()
    assert metrics.tracked() == 0 and metrics.counts[("ended", "client_gone")] == 1


async def test_a_termination_naming_a_group_gives_back_only_that_groups_handles() -> None:
    b1 = FakeBroker("b1")
    clock, metrics = [0.0], Recorder()
    r = renewer([b1], clock, metrics)
    r.opened("c1", account="alice")
    r.track("c1", "billing", [handle("b1", token="a1")], account="alice")
    r.track("c1", "audit", [handle("b1", token="a2")], account="alice")
    await r.terminated("c1", account="alice", group="billing")
    assert [(req.group, list(req.receipt_handles)) for req in b1.renews] == [("billing", [handle("b1", token="a1")])]
    assert metrics.tracked() == 1


async def test_without_accounts_a_client_id_is_the_client_whoever_sends_it() -> None:
    b1 = FakeBroker("b1")
    clock, metrics = [0.0], Recorder()
    r = renewer([b1], clock, metrics)
    r.track("c1", "g", [handle("b1", token="a1")])
    r.track("c1", "h", [handle("b1", token="a2")])
    await r.terminated("c1", group="g")  # every handle of the id, as before accounts were told apart
    assert sorted(h for req in b1.renews for h in req.receipt_handles) == [handle("b1", token=t) for t in ("a1", "a2")]


async def test_a_client_another_proxy_reports_live_keeps_what_it_received_here_renewed() -> None:
    """A PushConsumer whose connection moved to another proxy (a load balancer, a connection's age) heartbeats there
    only: that proxy's consumer report says it is live, so what it received here is still renewed while it holds it.
    A client no proxy reports is dropped; one lookup per group and round of clients unheard here, not per renewal."""
    b1 = FakeBroker("b1")
    clock, metrics = [0.0], Recorder()
    r = renewer([b1], clock, metrics)
    asked: list[str] = []

    async def reported_elsewhere(group: str) -> set[str] | None:
        asked.append(group)
        return {"moved"}

    r.elsewhere = reported_elsewhere
    r.track("moved", "g", [handle("b1", token="a1"), handle("b1", token="a2")], account="alice")
    r.track("gone", "g", [handle("b1", token="b1")])
    for second in range(20, 201, 20):
        clock[0] = second
        await r.renew_due()
    assert list(b1.renews[-1].receipt_handles) == [handle("b1", token="a1"), handle("b1", token="a2")]
    assert metrics.tracked() == 2 and metrics.counts[("ended", "client_gone")] == 1
    assert 3 <= len(asked) <= 5 and set(asked) == {"g"}  # every 30 to 40 s, once for both clients


def test_a_client_asked_about_is_gone_unless_reported_or_heard_here_since() -> None:
    b = book(alive_s=30)
    for client in ("unknown", "back", "elsewhere"):
        b.track(client, "g", pairs(client.encode().hex()), now=0)
    due = b.take_due(40, ask=True)
    assert due.asks == {"g": {"unknown", "back", "elsewhere"}} and len(due.batches[("b1", "g")]) == 3 and not due.ended
    b.heard("back", now=41)  # its heartbeat came here while the brokers were asked
    assert b.answered(due.asks, {"g": {"elsewhere"}}, now=42) == 1
    assert len(b) == 2 and b.alive("elsewhere", now=71) and not b.alive("elsewhere", now=72)
    assert b.answered(b.take_due(80, ask=True).asks, {"g": None}, now=80) == 2  # no broker answered: gone
