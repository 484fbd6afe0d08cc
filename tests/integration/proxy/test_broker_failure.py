"""A broker killed with -9 while producing and consuming: the others carry on, nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import grpc
import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc
from popgate_pb.v2 import definition_pb2 as v2

from popgate_contract import errors
from proxy.brokers import GrpcBrokerClient
from proxy.settings import BrokerAddress
from tests.forwarder import Forwarder
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster
from tests.procs import ServerProcess, broker_args
from tests.unit.proxy.fakes import one_send

TOPIC, GROUP = "chaos", "g"


class Load:
    """A producer and a consumer thread through the proxy, counting what the proxy acknowledged."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.stop = threading.Event()  # stops the producer
        self.done = threading.Event()  # stops the consumer
        self.lock = threading.Lock()
        self.sent: set[bytes] = set()
        self.received: set[bytes] = set()
        self.send_errors = 0
        self.threads = [threading.Thread(target=self._produce), threading.Thread(target=self._consume)]

    def _produce(self) -> None:
        client, n = V2Client(self.endpoint), 0
        try:
            while not self.stop.is_set():
                bodies = [f"m{n + i}".encode() for i in range(10)]
                n += 10
                try:
                    reply = client.send(TOPIC, bodies)
                except grpc.RpcError:
                    reply = None
                with self.lock:
                    if reply is not None and reply.status.code == v2.OK:
                        self.sent.update(bodies)
                    else:
                        self.send_errors += 1
                self.stop.wait(0.005)  # pacing, so the two cores stay shared with the consumer
        finally:
            client.close()

    def _consume(self) -> None:
        client = V2Client(self.endpoint)
        try:
            while not self.done.is_set():
                try:
                    _, messages = client.receive(TOPIC, GROUP, invisible_s=2, poll_s=1)
                    if messages and client.ack(TOPIC, GROUP, messages).status.code in (v2.OK, v2.MULTIPLE_RESULTS):
                        with self.lock:
                            self.received.update(m.body for m in messages)
                except grpc.RpcError:
                    continue
        finally:
            client.close()

    def missing(self) -> int:
        with self.lock:
            return len(self.sent - self.received)

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.sent), len(self.received)


def wait_for(condition: Callable[[], bool], limit_s: float, what: str) -> None:
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, f"timed out after {limit_s} s waiting for {what}"
        time.sleep(0.05)


def test_kill_9_a_broker_while_producing_and_consuming(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(brokers=3)
    load = Load(cluster.endpoint)
    for thread in load.threads:
        thread.start()
    try:
        wait_for(lambda: load.counts()[1] >= 200, 30, "traffic before the kill")
        cluster.brokers["b2"].kill()
        sent_at_kill, received_at_kill = load.counts()
        wait_for(lambda: load.counts()[0] >= sent_at_kill + 300, 30, "sends to continue on the other brokers")
        wait_for(lambda: load.counts()[1] >= received_at_kill + 300, 30, "consumers to keep receiving")
        cluster.restart_child("b2")
        wait_for(lambda: load.counts()[0] >= sent_at_kill + 600, 30, "sends after the restart")
        load.stop.set()
        # Drain: every message whose send was acknowledged is delivered (b2's come back after its restart).
        wait_for(lambda: load.missing() == 0, 60, "every acknowledged message to be consumed")
    finally:
        load.stop.set()
        load.done.set()
        for thread in load.threads:
            thread.join(15)
    missing = load.sent - load.received
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"


@pytest.mark.parametrize("mode", ["notify", "adaptive"])
def test_a_long_poll_started_while_a_broker_is_down_gets_a_message_stored_there_once_it_is_back(
    make_cluster: MakeCluster, mode: str
) -> None:
    """The receive starts while the proxy sees b1 down (stopped); b1 comes back mid-poll and a message lands on it: the
    receive gets it then (before, b1 was never watched by that receive: empty after the whole poll)."""
    cluster = make_cluster(brokers=2, proxy_args=("--receive-mode", mode, "--min-invisible-s", "1"))
    proxy_log = cluster.proxies[0].log_path
    assert proxy_log is not None
    b1 = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.brokers["b1"].address))  # type: ignore[no-untyped-call]
    b1.Send(bpb.SendRequest(messages=[bpb.Message(topic=TOPIC, message_id="WARM", body=b"warm")]), timeout=5)
    client = V2Client(cluster.endpoint)
    try:
        _, warm = client.receive(TOPIC, GROUP, poll_s=5)  # the group is known on b1
        assert [m.body for m in warm] == [b"warm"] and client.ack(TOPIC, GROUP, warm).status.code == v2.OK
        # SIGTERM, not kill -9: the ack above is answered before its commit (--flush async), and a lost ack would
        # bring `warm` back in place of the message this test waits for.
        cluster.brokers["b1"].stop()
        wait_for(lambda: "broker b1" in proxy_log.read_text() and "is now down" in proxy_log.read_text(), 15,
                 "the proxy to see b1 down")  # fmt: skip
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.receive, TOPIC, GROUP, batch=1, poll_s=20)
            cluster.restart_child("b1")
            wait_for(lambda: "is now up" in proxy_log.read_text(), 15, "the proxy to see b1 up")
            b1 = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.brokers["b1"].address))  # type: ignore[no-untyped-call]
            b1.Send(bpb.SendRequest(messages=[bpb.Message(topic=TOPIC, message_id="BACK", body=b"on-b1")]), timeout=5)
            sent = time.monotonic()
            status, messages = waiting.result(timeout=30)
        assert status.code == v2.OK and [m.body for m in messages] == [b"on-b1"], status
        assert time.monotonic() - sent < 10, "answered at the end of the poll, not when the message landed"
    finally:
        client.close()


def test_an_ack_right_after_the_broker_restarts_is_not_refused(make_cluster: MakeCluster) -> None:
    """The broker is back and serving: an ack of a message it handed out before its restart goes through,
    instead of HA_NOT_AVAILABLE while the proxy's channel to it waits out its reconnect back-off."""
    cluster = make_cluster(brokers=1)
    client = V2Client(cluster.endpoint)
    try:
        assert client.send(TOPIC, [b"before"]).status.code == v2.OK
        _, messages = client.receive(TOPIC, GROUP, invisible_s=30, poll_s=2)
        assert [m.body for m in messages] == [b"before"]
        cluster.brokers["b1"].stop()  # SIGTERM: its state is on disk (kill -9 may lose the last 2 ms of it)
        down = client.ack(TOPIC, GROUP, messages)  # the channel fails to connect and backs off
        assert down.status.code == v2.HA_NOT_AVAILABLE, down.status
        cluster.restart_child("b1")  # returns once the broker prints ready
        reply = client.ack(TOPIC, GROUP, messages)
        assert reply.status.code == v2.OK, reply.status
        cluster.brokers["b1"].stop()  # and it stays acked: not delivered again after another restart
        cluster.restart_child("b1")
        _, again = client.receive(TOPIC, GROUP, invisible_s=30, poll_s=2)
        assert again == []
    finally:
        client.close()


def test_an_ack_whose_answer_was_lost_is_not_tried_again_and_called_stale(tmp_path: Path) -> None:
    """The broker applied the ack, the answer was lost with the connection (a network blip): the ack's outcome is
    unknown (HA_NOT_AVAILABLE, retriable), not "stale handle", which a retry would have got for an ack that took
    effect. (Only a request that never left is tried again.)"""

    async def scenario(address: str, forwarder: Forwarder) -> tuple[errors.DomainError, int]:
        client = GrpcBrokerClient(BrokerAddress("b1", forwarder.address))
        try:
            await client.send(one_send(bpb.Message(topic="t", body=b"m")), timeout_s=5)
            pop = bpb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000)
            [message] = (await client.begin_pop(pop, timeout_s=5)).messages
            forwarder.drop_answers(for_s=0.4)
            with pytest.raises(errors.DomainError) as failed:
                ack = bpb.AckRequest(topic="t", group="g", receipt_handles=[message.receipt_handle])
                await client.ack(ack, timeout_s=3)
        finally:
            await client.close()
        async with grpc.aio.insecure_channel(address) as channel:
            stats = await broker_pb2_grpc.BrokerStub(channel).Stats(bpb.StatsRequest(topic="t"), timeout=5)
        return failed.value, sum(g.consumer_offset for g in stats.groups)

    broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1"))
    broker.start()
    forwarder = Forwarder(broker.address)
    try:
        error, acked = asyncio.run(scenario(broker.address, forwarder))
    finally:
        forwarder.close()
        broker.stop()
    assert acked == 1  # the ack took effect
    assert type(error) is errors.BrokerUnavailable, error  # unknown outcome, retriable: not InvalidReceiptHandle


async def ack_of_one_message(client: GrpcBrokerClient) -> bpb.AckRequest:
    """Sends a message to the client's broker, pops it, and returns the request that would ack it."""
    await client.send(one_send(bpb.Message(topic="t", body=b"m")), timeout_s=5)
    pop = bpb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000)
    [message] = (await client.begin_pop(pop, timeout_s=5)).messages
    return bpb.AckRequest(topic="t", group="g", receipt_handles=[message.receipt_handle])


def test_an_ack_to_a_hung_broker_marked_down_is_refused_unsent_not_held_to_its_deadline(tmp_path: Path) -> None:
    """A stopped broker (SIGSTOP) keeps its connection: written, an ack waited its whole deadline there, and every
    SDK retry of it too (27 s in a review's probe). Marked down by its health checks, it is refused at once, unsent
    (HA_NOT_AVAILABLE: safe to retry), and goes through again once the broker is back."""

    async def scenario(proc: Any) -> tuple[float, errors.DomainError]:
        client = GrpcBrokerClient(BrokerAddress("b1", broker.address))
        try:
            ack = await ack_of_one_message(client)
            proc.send_signal(signal.SIGSTOP)
            try:
                assert not await client.check_health(timeout_s=0.5)  # as the proxy's health monitor finds it
                started = time.monotonic()
                with pytest.raises(errors.DomainError) as refused:
                    await client.ack(ack, timeout_s=3)
                took = time.monotonic() - started
            finally:
                proc.send_signal(signal.SIGCONT)
            assert await client.check_health(timeout_s=5)
            assert all(r.ok for r in (await client.ack(ack, timeout_s=5)).results)  # back: acked
            return took, refused.value
        finally:
            await client.close()

    broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1"))
    broker.start()
    try:
        assert broker.proc is not None
        took, error = asyncio.run(scenario(broker.proc))
    finally:
        broker.stop()
    assert isinstance(error, errors.BrokerNotReached), error
    assert took < 1.0, f"held {took:.2f} s"


def test_an_ack_to_a_dead_broker_is_refused_at_once_not_after_a_reconnect_wait(tmp_path: Path) -> None:
    """Nothing listens at a dead broker's address: an ack for it is refused unsent (HA_NOT_AVAILABLE) at once. It
    waited 2 s for the channel to reconnect, every SDK retry of it too (19 s an ack in a review's probe)."""

    async def scenario() -> list[float]:
        client = GrpcBrokerClient(BrokerAddress("b1", broker.address))
        try:
            ack = await ack_of_one_message(client)
            broker.stop()
            took = []
            for _ in range(3):
                started = time.monotonic()
                # (the first may have been written as the session closed: outcome unknown, BrokerUnavailable)
                with pytest.raises(errors.BrokerUnavailable):
                    await client.ack(ack, timeout_s=5)
                took.append(time.monotonic() - started)
            return took
        finally:
            await client.close()

    broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1"))
    broker.start()
    try:
        took = asyncio.run(scenario())
    finally:
        broker.stop()
    assert max(took) < 1.0, f"refused after {took} s"


def test_a_broker_restarted_while_covered_long_polls_wait_is_watched_again(make_cluster: MakeCluster) -> None:
    """Every receive a long poll (adaptive, rate criterion): 2 Pops over 3 brokers, the third watched. That broker
    restarts: its watch fails, and it is watched again once back, so a message stored there reaches a waiting
    consumer, not the end of both long polls (a review's probe: both answered empty after their 20 s)."""
    args = ("--min-invisible-s", "1", "--adaptive-concurrency-per-broker", "0", "--adaptive-rate-threshold", "0.01")
    cluster = make_cluster(brokers=3, proxy_args=("--receive-mode", "adaptive", *args))
    brokers = {n: broker_pb2_grpc.BrokerStub(grpc.insecure_channel(c.address)) for n, c in cluster.brokers.items()}  # type: ignore[no-untyped-call]

    def held() -> dict[str, tuple[int, int]]:
        out = {}
        for name, stub in brokers.items():
            stats = stub.Stats(bpb.StatsRequest(), timeout=2)
            out[name] = (stats.held_pops, stats.held_notifications)
        return out

    clients = [V2Client(cluster.endpoint) for _ in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(c.receive, TOPIC, GROUP, batch=1, invisible_s=30, poll_s=10) for c in clients]
            deadline = time.monotonic() + 10
            while sorted(held().values()) != [(0, 1), (1, 0), (1, 0)]:
                assert time.monotonic() < deadline, held()
                time.sleep(0.02)
            watched = next(name for name, (pops, _) in held().items() if pops == 0)
            cluster.brokers[watched].stop()
            cluster.restart_child(watched)
            brokers[watched] = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.brokers[watched].address))  # type: ignore[no-untyped-call]
            while held()[watched] != (0, 1):  # watched again once the proxy sees it up
                assert time.monotonic() < deadline + 10, held()
                time.sleep(0.02)
            message = bpb.Message(topic=TOPIC, message_id="AFTER", body=b"after-restart")
            brokers[watched].Send(bpb.SendRequest(messages=[message]), timeout=5)
            first_waiting_consumer_gets(waiting, b"after-restart", sent=time.monotonic())
    finally:
        for client in clients:
            client.close()


def test_a_proxy_stopping_does_not_report_its_brokers_down(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Closing the proxy's broker clients ends their held requests: that is the proxy stopping, not the broker
    failing (a Ctrl-C of `popgate up` in adaptive mode logged 'broker b2 ... is now down' for brokers serving)."""

    async def scenario() -> tuple[bool, str]:
        client = GrpcBrokerClient(BrokerAddress("b1", broker.address))
        stats = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(broker.address))  # type: ignore[no-untyped-call]
        watch = bpb.NotificationRequest(topic="t", group="g", filter="*", poll_ms=10_000)
        held = client.begin_notification(watch, timeout_s=15)
        held_there = lambda: stats.Stats(bpb.StatsRequest(), timeout=2).held_notifications >= 1  # noqa: E731
        await asyncio.to_thread(wait_for, held_there, 5, "the Notification held at the broker")
        await client.close()
        with pytest.raises(errors.DomainError) as ended:
            await held
        return client.healthy, ended.value.message

    broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1"))
    broker.start()
    try:
        with caplog.at_level("WARNING", logger="proxy.brokers"):
            healthy, why = asyncio.run(scenario())
    finally:
        broker.stop()
    assert healthy, why
    assert "is now down" not in caplog.text


def first_waiting_consumer_gets(waiting: Any, body: bytes, *, sent: float) -> None:
    """The first of the `waiting` receives (futures of (status, messages)) answers `body` within 5 s of `sent`, before
    its long poll ends: the message was watched for, not found at the next poll."""
    done, _ = wait(waiting, timeout=10, return_when=FIRST_COMPLETED)
    assert done, "no consumer got it before its long poll ended"
    status, messages = next(iter(done)).result()
    assert status.code == v2.OK and [m.body for m in messages] == [body]
    assert time.monotonic() - sent < 5
