"""BrokerCore over a real SqliteStore, without sockets: what a commit stores takes effect even when the
request that made it fails or goes away, and a group's start offsets are fixed when it first looks."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin, store_wal
from broker.core import BrokerCore
from broker.sqlite_store import SqliteStore
from broker.store import DeleteInflight
from popgate_contract.errors import StoreUnavailable, TopicNotFound
from tests.unit.broker.cores import broker


def fail_next_commit(store: SqliteStore) -> None:
    """The next group commit fails as on a full disk; later ones succeed."""
    real = store._apply

    def fail_once(batch: list[Any], *, begun: bool = False) -> None:
        store._apply = real  # type: ignore[method-assign]
        if begun:  # an inline commit's transaction: ended as a failed commit's is
            store_wal.roll_back(store._conn)
        for request in batch:
            request.result = StoreUnavailable("disk full (injected)")

    store._apply = fail_once  # type: ignore[method-assign]


async def until_held(core: BrokerCore, count: int, within_s: float = 5.0) -> None:
    """Wait (bounded) until `count` requests are held: a request in flight has reached its long poll."""
    async with asyncio.timeout(within_s):
        while core.hold.total_held < count:  # noqa: ASYNC110  # the hold has no event for "one more held"
            await asyncio.sleep(0.001)


async def test_a_topic_whose_first_send_failed_is_whole_after_a_restart(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=4) as (core, store):
        fail_next_commit(store)
        with pytest.raises(StoreUnavailable):
            await core.send([pb.Message(topic="t", body=b"refused")])
        for body in (b"a", b"b", b"c"):
            await core.send([pb.Message(topic="t", body=body)])
    async with broker(tmp_path, queues_per_topic=4) as (core, _):
        assert [q.queue_id for q in core.topics["t"].queues] == [0, 1, 2, 3]
        popped = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert sorted(pb.Message.FromString(p.payload).body for p in popped.messages) == [b"a", b"b", b"c"]
        sent = await asyncio.wait_for(core.send([pb.Message(topic="t", body=b"d")]), 5)
        assert sent[0].offset >= 0


async def test_a_delayed_send_cancelled_during_its_commit_is_still_delivered(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        due = core.clock.now_ms() + 200
        send = asyncio.create_task(core.send([pb.Message(topic="t", body=b"later", deliver_at_ms=due)]))
        await asyncio.sleep(0)  # the Send now waits for its commit
        send.cancel()  # as when the proxy's timeout or a lost session cancels it
        await asyncio.gather(send, return_exceptions=True)
        popped = await core.pop("t", "g", "*", 32, 30_000, 5_000)  # woken by the delivery, not a sweep
        assert [pb.Message.FromString(p.payload).body for p in popped.messages] == [b"later"]
        assert core.clock.now_ms() >= due


async def test_a_latest_group_gets_the_message_that_ended_its_notification(tmp_path: Path) -> None:
    async with broker(tmp_path, consume_from="latest") as (core, _):
        await core.send([pb.Message(topic="t", body=b"before the group")])
        waiting = asyncio.create_task(core.notification("t", "g", "*", 5_000))
        await until_held(core, 1)
        await core.send([pb.Message(topic="t", body=b"after")])
        has_message, _ = await waiting
        assert has_message
        popped = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert [pb.Message.FromString(p.payload).body for p in popped.messages] == [b"after"]


async def test_under_latest_a_dead_letter_topic_is_still_read_from_its_first_letter(tmp_path: Path) -> None:
    # `popgate dlq resend` reads %DLQ%<group> as a group of its own, after the letters are there.
    async with broker(tmp_path, consume_from="latest") as (core, _):
        await core.pop("orders", "billing", "*", 1, 10_000, 0)  # the group looks first: it starts here
        await core.send([pb.Message(topic="orders", body=b"order-42")])
        [m] = (await core.pop("orders", "billing", "*", 1, 10_000, 0)).messages
        await core.dead_letter("orders", "billing", m.handle)
        got = await core.pop("%DLQ%billing", "popgate-dlq-resend", "*", 32, 30_000, 0)
    assert [pb.Message.FromString(p.payload).body for p in got.messages] == [b"order-42"]


async def test_a_latest_group_keeps_its_unread_messages_across_a_restart(tmp_path: Path) -> None:
    async with broker(tmp_path, consume_from="latest") as (core, _):
        await core.send([pb.Message(topic="t", body=b"before the group")])
        assert (await core.pop("t", "g", "*", 32, 30_000, 0)).messages == []  # the group starts here
        await core.send([pb.Message(topic="t", body=b"m%d" % i) for i in range(4)])
    async with broker(tmp_path, consume_from="latest") as (core, _):
        popped = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert sorted(pb.Message.FromString(p.payload).body for p in popped.messages) == [
            b"m0",
            b"m1",
            b"m2",
            b"m3",
        ]
    with closing(sqlite3.connect(tmp_path / "broker.sqlite3")) as db:
        rows = db.execute("SELECT count(*) FROM pull_offsets").fetchone()
    assert rows[0] >= 1


async def test_with_sync_flush_a_held_pop_sees_a_message_sent_during_its_first_commit(tmp_path: Path) -> None:
    async with broker(tmp_path, flush="sync") as (core, _):
        await core.send([pb.Message(topic="t", body=b"x", tag="other")])
        # Filter "a": the first pass stores the filter and moves the pull offset past "other",
        # and with sync flush it waits for that commit before it is held.
        pop = asyncio.create_task(core.pop("t", "g", "a", 1, 30_000, 10_000))
        await asyncio.sleep(0)
        await core.send([pb.Message(topic="t", body=b"wanted", tag="a")])
        popped = await asyncio.wait_for(pop, 5)  # well before the 10 s poll ends
        assert [pb.Message.FromString(p.payload).body for p in popped.messages] == [b"wanted"]


async def test_declared_topics_are_the_only_ones_with_auto_create_off(tmp_path: Path) -> None:
    async with broker(tmp_path, auto_create=False, queues_per_topic=2) as (core, _):
        assert await core.create_topics(["orders", "orders"]) == ["orders"]
        with pytest.raises(TopicNotFound):
            await core.send([pb.Message(topic="other", body=b"x")])
        await core.send([pb.Message(topic="orders", body=b"x")])
    async with broker(tmp_path, auto_create=False, queues_per_topic=2) as (core, _):
        assert await core.create_topics(["orders"]) == []  # already there after the restart
        assert len(core.topics["orders"].queues) == 2
        popped = await core.pop("orders", "g", "*", 32, 30_000, 0)
        assert len(popped.messages) == 1


async def test_the_sweep_wakes_a_held_request_only_for_what_its_own_filter_takes(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        waiting = asyncio.create_task(core.notification("t", "n", "a", 20_000))
        await until_held(core, 1)
        await core.send([pb.Message(topic="t", body=b"not for n", tag="b")])
        core.sweep()
        await asyncio.sleep(0.05)  # time for a wrong wake to show (a negative: nothing to wait on)
        assert not waiting.done()  # its own filter ("a") decides, not the group's (match-all)
        await core.send([pb.Message(topic="t", body=b"for n", tag="a")])
        assert await asyncio.wait_for(waiting, 5) == (True, False)


async def test_polling_topics_that_do_not_exist_keeps_no_group_state(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        for i in range(50):
            assert (await core.pop(f"nosuch{i}", "g", "tagA", 32, 30_000, 0)).messages == []
            assert await core.notification(f"nosuch{i}", "g", "tagA", 0) == (False, False)
        assert core.groups == {}
    with closing(sqlite3.connect(tmp_path / "broker.sqlite3")) as db:
        rows = db.execute("SELECT count(*) FROM group_filters").fetchone()
    assert rows[0] == 0


async def test_a_latest_group_waiting_before_its_topic_exists_gets_the_first_message(tmp_path: Path) -> None:
    async with broker(tmp_path, consume_from="latest") as (core, _):
        held = asyncio.create_task(core.pop("fresh", "g1", "*", 32, 30_000, 5_000))
        waiting = asyncio.create_task(core.notification("fresh", "g2", "*", 5_000))
        await until_held(core, 2)
        await core.send([pb.Message(topic="fresh", body=b"first")])
        popped = await asyncio.wait_for(held, 5)
        assert [pb.Message.FromString(p.payload).body for p in popped.messages] == [b"first"]
        assert await asyncio.wait_for(waiting, 5) == (True, False)
        after = await core.pop("fresh", "g2", "*", 32, 30_000, 0)  # the Pop a notify run makes next
        assert [pb.Message.FromString(p.payload).body for p in after.messages] == [b"first"]


@pytest.mark.parametrize("flush", ["async", "sync"])
async def test_a_pop_cancelled_while_it_reads_its_messages_leaves_them_ready(tmp_path: Path, flush: str) -> None:
    """Reserved messages are put back (same attempt count) when the Pop is cancelled before it answers,
    not hidden for their invisible time and pushed towards the dead-letter queue."""
    async with broker(tmp_path, flush=flush, cache_bytes=1) as (core, _):  # payloads come from the store
        await core.send([pb.Message(topic="t", body=b"%d" % i) for i in range(4)])
        for _ in range(5):
            pop = asyncio.ensure_future(core.pop("t", "g", "*", 4, 60_000, 0))
            await asyncio.sleep(0)  # it has reserved its messages and waits for their payloads
            pop.cancel()
            await asyncio.gather(pop, return_exceptions=True)
        popped = await core.pop("t", "g", "*", 32, 60_000, 0)
        assert sorted(pb.Message.FromString(p.payload).body for p in popped.messages) == [b"0", b"1", b"2", b"3"]
        assert {p.attempt for p in popped.messages} == {1}


class FullDisk:
    """While in use, the store's commits are refused as on a full disk, the ops submitted counted; with
    `deletions_pass`, a commit of deletions alone goes through (it changes no page of rows never stored, so SQLite
    commits it on a full disk too)."""

    def __init__(self, store: SqliteStore, *, deletions_pass: bool = False) -> None:
        self.store, self.real, self.deletions_pass = store, store._apply, deletions_pass
        self.submitted = 0

    def __call__(self, batch: list[Any], *, begun: bool = False) -> None:
        self.submitted += sum(len(request.ops) for request in batch)
        if self.deletions_pass and all(isinstance(op, DeleteInflight) for r in batch for op in r.ops):
            self.real(batch, begun=begun)
            return
        if begun:  # an inline commit's transaction: ended as a failed commit's is
            store_wal.roll_back(self.store._conn)
        for request in batch:
            request.result = StoreUnavailable("disk full (injected)")

    def __enter__(self) -> FullDisk:
        self.store._apply = self  # type: ignore[method-assign]
        return self

    def __exit__(self, *_: object) -> None:
        self.store._apply = self.real  # type: ignore[method-assign]


async def pop_and_ack(core: BrokerCore, times: int) -> None:
    for _ in range(times):
        popped = await core.pop("t", "g", "*", 32, 60_000, 0)
        await core.ack("t", "g", [p.handle for p in popped.messages])
        await asyncio.sleep(0)  # each commit's outcome is known before the next Pop (its callback ran)


async def test_consuming_while_the_store_refuses_writes_does_not_resubmit_the_backlog_each_time(tmp_path: Path) -> None:
    """Rows the store refused are retried by the sweep (once a second) and written once it takes writes
    again, not carried by every Pop and Ack: that made each commit cost the whole backlog."""

    async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, store):  # commits awaited
        for start in range(0, 3200, 800):
            await core.send([pb.Message(topic="t", body=b"%d" % i) for i in range(start, start + 800)])
        with FullDisk(store) as full:
            await pop_and_ack(core, 100)
        core.sweep()  # the retry: everything lost is written now
        await asyncio.sleep(0.2)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        rest = await core.pop("t", "g", "*", 32, 60_000, 0)
        redelivered = len(rest.messages)
    assert full.submitted < 20_000  # ~70 ops a Pop + Ack, not the backlog again with each (~350,000)
    assert redelivered == 0  # the retry stored every ack: nothing comes back after the restart


async def test_acks_that_commit_on_a_full_disk_do_not_end_its_refusal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a full disk a commit that changes no page succeeds (an ack deleting a delivery the store never got): that
    is no sign the store takes writes again, so the backlog is not sent with every such ack, and the refusal is
    logged once."""

    async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, store):
        await core.send([pb.Message(topic="t", body=b"%d" % i) for i in range(800)])
        with caplog.at_level(logging.WARNING, logger="broker.commits"), FullDisk(store, deletions_pass=True) as full:
            await pop_and_ack(core, 25)
    assert full.submitted < 3_000  # each Pop's and Ack's own ops (~1,600), not the backlog with each Ack (~12,000)
    assert caplog.text.count("store refuses writes") == 1


async def test_a_held_pop_woken_for_its_message_reads_with_its_own_filter(tmp_path: Path) -> None:
    """Two Pops of one group held with different filters (the group changed its subscription): the one a
    message wakes reads with its own filter, not the other's, and the message is not skipped for the group."""

    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"first", tag="a")])
        await core.pop("t", "g", "a", 1, 60_000, 0)  # the group exists; its start is fixed
        wants_a = asyncio.ensure_future(core.pop("t", "g", "a", 1, 60_000, 3000))
        await until_held(core, 1)
        wants_b = asyncio.ensure_future(core.pop("t", "g", "b", 1, 60_000, 3000))
        await until_held(core, 2)
        await core.send([pb.Message(topic="t", body=b"for a", tag="a")])
        got = await asyncio.wait_for(wants_a, 5)
        wants_b.cancel()
        await asyncio.gather(wants_b, return_exceptions=True)
    assert [pb.Message.FromString(p.payload).body for p in got.messages] == [b"for a"]


async def test_a_pop_that_reads_again_after_its_sync_commit_reads_with_its_own_filter(tmp_path: Path) -> None:
    """Under --flush sync a Pop whose first pass found nothing waits for that pass's commit, and reads again when a
    message arrived meanwhile: with its own filter, though a Pop of the group with another filter ran meanwhile,
    and the message is delivered, not skipped for the group."""

    async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, _):
        await core.send([pb.Message(topic="t", body=b"old", tag="a")])
        committing, go_on = asyncio.Event(), asyncio.Event()
        real = core.commits.write

        async def write_when_let(ops: Any) -> None:  # the first commit waits until the test lets it go on
            if not committing.is_set():
                committing.set()
                await go_on.wait()
            await real(ops)

        core.commits.write = write_when_let  # type: ignore[method-assign]
        wants_b = asyncio.ensure_future(core.pop("t", "g", "b", 1, 60_000, 0))  # skips "old": a commit to wait for
        await asyncio.wait_for(committing.wait(), 5)
        assert (await core.pop("t", "g", "a", 1, 60_000, 0)).messages == []  # the group's filter is "a" now
        await core.send([pb.Message(topic="t", body=b"for b", tag="b")])
        go_on.set()
        got = await asyncio.wait_for(wants_b, 5)
    assert [pb.Message.FromString(p.payload).body for p in got.messages] == [b"for b"]


async def test_bad_list_ranges_and_tags_that_no_filter_can_select_are_bad_requests(tmp_path: Path) -> None:
    from popgate_contract.errors import BadRequest, IllegalMessage

    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        with pytest.raises(BadRequest, match="out of range"):
            await core.list_messages("t", 0, 2**63 - 1, 10)
        with pytest.raises(IllegalMessage, match="whitespace"):
            await core.send([pb.Message(topic="t", body=b"x", tag=" a ")])


async def test_a_groups_first_look_by_notification_sets_the_filter_its_lag_counts_with(tmp_path: Path) -> None:
    """A proxy announces a group to every broker with a Notification (proxy.receive.announce): where the group has not
    popped yet, its lag counts the messages its filter takes, not every message."""

    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x", tag=tag) for tag in ("a", "b", "b")])
        assert await core.notification("t", "g", "a", 0) == (True, False)
        [row] = core.lags("t", "g")
        await core.notification("t", "g", "b", 0)  # a later look does not change it: Pops set the filter
        [again] = core.lags("t", "g")
    assert (row.lag.lag, again.lag.lag) == (1, 1)


async def test_a_group_that_looked_before_its_topic_existed_has_lag_here_from_the_topics_first_messages(
    tmp_path: Path,
) -> None:
    """A proxy announces a group to every broker at its first receive; a broker where the topic appears only
    later (sends spread over brokers) counts the group's lag from then on, also after a restart — before, the
    group was in no lag figure there until it popped there (a review's `popgate stats`: lag 5 of 10)."""

    async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, _):
        assert await core.notification("later", "g", "a", 0) == (False, False)  # the announcement
        await core.send([pb.Message(topic="later", body=b"x", tag=tag) for tag in ("a", "b", "a")])
        before = [row.lag.lag for row in core.lags("later", "g")]
    async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, _):
        after = [row.lag.lag for row in core.lags("later", "g")]
        popped = await core.pop("later", "g", "a", 32, 30_000, 0)
        assert len(popped.messages) == 2, "the group does not start at the topic's first message"
    assert (before, after) == ([2], [2])


async def test_the_sweep_delivers_a_message_whose_wake_was_lost(tmp_path: Path) -> None:
    """docs/ARCHITECTURE.md §2: waiters are woken on arrival, "plus a slow periodic sweep as a safety net". Here
    the arrival's wake is lost (as in the race docs/RECEIVE.md step 4 describes); the sweep is what hands the
    message over."""
    async with broker(tmp_path) as (core, _):
        held = asyncio.create_task(core.pop("t", "g", "*", 32, 30_000, 20_000))
        await until_held(core, 1)
        core.hold.arrived = lambda *args, **kwargs: 0  # type: ignore[method-assign]  # the wake is lost
        await core.send([pb.Message(topic="t", body=b"ready")])
        await asyncio.sleep(0.05)  # time for a wake to show (a negative: nothing to wait on)
        assert not held.done()
        core.sweep()
        popped = await asyncio.wait_for(held, 5)
        assert [pb.Message.FromString(p.payload).body for p in popped.messages] == [b"ready"]


async def test_acks_applied_while_their_topic_is_deleted_are_answered_ok(tmp_path: Path) -> None:
    async with broker(tmp_path, flush="sync") as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        popped = await core.pop("t", "g", "*", 1, 30_000, 0)
        acking = asyncio.create_task(core.ack("t", "g", [m.handle for m in popped.messages]))
        await asyncio.sleep(0)  # the ack is applied and waits for its commit
        admin.forget_topic(core, "t")  # an admin DeleteTopic meanwhile
        assert await acking == [None]
        assert ("t", "g") not in core.messages_acked  # no counter comes back for the deleted topic
