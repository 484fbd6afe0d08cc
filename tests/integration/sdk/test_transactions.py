"""popgate's SDK, blocking and asyncio, against a real cluster: transactions (a ``with`` block commits, an
exception rolls back, a checker resolves what a producer left), recall of a delay message, priority."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate import Message, NotFound, Producer, SimpleConsumer, aio
from popgate.cli.cluster import Cluster
from popgate.cli.main import main
from tests.integration.sdk.conftest import WAIT, drain, start_cluster

# The brokers check an unresolved half message soon, so the checker test needs no long wait.
CHECK_ARGS = ("--transaction-immunity-s", "0.5", "--transaction-check-interval-s", "1")


@pytest.fixture(scope="module")
def tx_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("tx"), broker_args=CHECK_ARGS)
    try:
        yield cluster
    finally:
        cluster.stop()


def nothing_more(consumer: SimpleConsumer, seconds: float = 1.5) -> list[Message]:
    got: list[Message] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        got += consumer.receive(max=32, wait=WAIT)
    return got


def test_a_with_block_commits_and_an_exception_rolls_back(tx_cluster: Cluster) -> None:
    with Producer(tx_cluster.endpoint) as producer, SimpleConsumer(tx_cluster.endpoint, "g_sdk_tx", "sdk_tx") as c:
        with producer.transaction() as tx:
            receipt = tx.send("sdk_tx", b"committed", keys=["o-1"])
            assert receipt.transaction_id and nothing_more(c, 0.5) == []  # invisible until the block ends
        with pytest.raises(RuntimeError), producer.transaction() as tx:
            tx.send("sdk_tx", b"rolled back")
            raise RuntimeError("the local transaction failed")
        assert [m.body for m in drain(c, 1)] == [b"committed"]
        assert nothing_more(c) == []


def test_a_checker_commits_what_a_producer_left_unresolved(tx_cluster: Cluster) -> None:
    asked: list[str] = []

    def checker(message: Message) -> bool:
        asked.append(message.message_id)
        return message.keys == ("commit",)

    with Producer(tx_cluster.endpoint) as gone:  # leaves its transaction open: as if it died
        kept = gone.transaction().send("sdk_orphans", b"kept", keys=["commit"])
        gone.transaction().send("sdk_orphans", b"dropped", keys=["drop"])
    with (
        Producer(tx_cluster.endpoint, checker=checker, topics=["sdk_orphans"]),
        SimpleConsumer(tx_cluster.endpoint, "g_sdk_orphans", "sdk_orphans") as consumer,
    ):
        got = drain(consumer, 1, timeout=20)
        assert [m.message_id for m in got] == [kept.message_id]
        assert nothing_more(consumer, 2.5) == []  # the other was rolled back by its check
    assert kept.message_id in asked and len(set(asked)) == 2


def test_a_checker_slower_than_the_checks_loses_no_committed_transaction(tmp_path: Path) -> None:
    """More orphaned transactions over two brokers than a slow checker answers within a half message's checks (2
    checks 1 s apart): the proxy hands the producer no more checks than it answers within the interval, and tells
    each broker the topic is asked for whichever took the room, so neither rolls back a half message unchecked and
    every transaction the checker commits is delivered."""
    n = 300
    cluster = start_cluster(tmp_path, brokers=2, broker_args=(*CHECK_ARGS, "--transaction-max-checks", "2"))

    def checker(message: Message) -> bool:
        time.sleep(0.02)  # ~50 answers a second: 300 take 6 s, more than the 2.5 s of a half message's checks
        return True

    try:
        with (
            Producer(cluster.endpoint, checker=checker, topics=["sdk_slow_checker"]),
            SimpleConsumer(cluster.endpoint, "g_sdk_slow_checker", "sdk_slow_checker") as consumer,
        ):
            # Sent with the checker online: sending them takes longer than a half message's checks on a slow host
            with Producer(cluster.endpoint) as gone:  # leaves its transactions open: as if it died
                sent = {gone.transaction().send("sdk_slow_checker", b"x").message_id for _ in range(n)}
            assert {m.message_id for m in drain(consumer, n, timeout=60)} == sent
    finally:
        cluster.stop()


def test_a_rolled_back_transaction_checked_while_still_open_is_not_delivered(tx_cluster: Cluster) -> None:
    asked: list[str] = []

    def checker(message: Message) -> bool:  # the docs' kind of checker: it would commit this one
        asked.append(message.message_id)
        return "paid" in message.keys

    with (
        Producer(tx_cluster.endpoint, checker=checker, topics=["sdk_open_tx"]) as producer,
        SimpleConsumer(tx_cluster.endpoint, "g_sdk_open_tx", "sdk_open_tx") as consumer,
    ):
        with pytest.raises(RuntimeError) as caught, producer.transaction() as tx:
            receipt = tx.send("sdk_open_tx", b"10 EUR", keys=["paid"])
            time.sleep(2.5)  # local work running past the broker's immunity: the broker checks the half
            raise RuntimeError("the order could not be saved")
        assert not getattr(caught.value, "__notes__", None)  # the rollback went through
        assert receipt.message_id not in asked
        assert nothing_more(consumer) == []


def test_recall_and_priority(tx_cluster: Cluster) -> None:
    with Producer(tx_cluster.endpoint) as producer, SimpleConsumer(tx_cluster.endpoint, "g_sdk_rc", "sdk_rc") as c:
        recalled = producer.send("sdk_rc", b"recalled", delay=1.0)
        producer.send("sdk_rc", b"kept", delay=1.0)
        assert producer.recall("sdk_rc", recalled.recall_handle) == recalled.message_id
        with pytest.raises(NotFound):
            producer.recall("sdk_rc", recalled.recall_handle)
        assert [m.body for m in drain(c, 1)] == [b"kept"]
        assert nothing_more(c, 1.0) == []
        for p in (1, 5, 3):
            producer.send("sdk_prio", f"p{p}", priority=p)
    with SimpleConsumer(tx_cluster.endpoint, "g_sdk_prio", "sdk_prio") as consumer:
        got = drain(consumer, 3)
        assert sorted(m.priority or 0 for m in got) == [1, 3, 5]
        by_queue: dict[tuple[str, int], list[int]] = {}
        for m in got:
            by_queue.setdefault((m.receipt_handle.split("~")[1], m.queue_id), []).append(m.priority or 0)
        assert all(order == sorted(order, reverse=True) for order in by_queue.values()), by_queue


async def test_the_asyncio_producer_commits_rolls_back_and_recalls(tx_cluster: Cluster, tmp_path: Path) -> None:
    async with aio.Producer(tx_cluster.endpoint) as producer:
        async with producer.transaction() as tx:
            await tx.send("sdk_aio_tx", b"committed")
        with pytest.raises(ValueError):
            async with producer.transaction() as tx:
                await tx.send("sdk_aio_tx", b"rolled back")
                raise ValueError("no")
        receipt = await producer.send("sdk_aio_tx", b"recalled", delay=5.0)
        assert await producer.recall("sdk_aio_tx", receipt.recall_handle) == receipt.message_id
    async with aio.SimpleConsumer(tx_cluster.endpoint, "g_sdk_aio_tx", "sdk_aio_tx") as consumer:
        got: list[Message] = []
        until = time.monotonic() + 3
        while time.monotonic() < until:
            batch = await consumer.receive(max=32, wait=WAIT)
            for m in batch:
                await consumer.ack(m)
            got += batch
            await asyncio.sleep(0)
        assert [m.body for m in got] == [b"committed"]


def test_the_popgate_command_sends_priorities_transactions_and_recalls(
    tx_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    e = ("-e", tx_cluster.endpoint, "-q")
    assert main(["send", *e, "cli_tx", "kept", "--transaction", "commit"]) == 0
    assert main(["send", *e[:2], "cli_tx", "dropped", "--transaction", "rollback"]) == 0
    assert "to cli_tx, rolled back: none will be delivered" in capsys.readouterr().err
    assert main(["send", *e, "cli_tx", "urgent", "--priority", "9"]) == 0
    assert main(["send", *e, "cli_tx", "later", "--delay", "5s", "--ids"]) == 0
    message_id, handle = capsys.readouterr().out.splitlines()[-1].split()
    assert main(["recall", *e, "cli_tx", handle]) == 0
    assert capsys.readouterr().out.split() == [message_id]
    assert main(["recall", *e, "cli_tx", handle]) == 1  # not scheduled any more: said on stderr
    with SimpleConsumer(tx_cluster.endpoint, "g_cli_tx", "cli_tx") as consumer:
        got = drain(consumer, 2)
        assert sorted(m.text() for m in got) == ["kept", "urgent"]
        assert nothing_more(consumer, 1.0) == []
