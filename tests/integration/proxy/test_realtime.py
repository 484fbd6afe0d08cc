"""Real-time receive through real processes: 3 brokers, one proxy, raw v2 stubs.

A long poll gets a message stored on any broker at once (notify and adaptive modes),
a client that goes away leaves no held request on any broker (every mode), and two
consumers racing for one message: one gets it, the other waits for the next.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Producer
from popgate import _wire as wire
from popgate.cli.cluster import Cluster, ClusterConfig
from tests.integration.proxy.client import V2Client
from tests.procs import NO_SWEEP_ARGS

POLL_S = 10  # the client's long-polling time: a false empty would take this long


@pytest.fixture(scope="module", params=["notify", "adaptive", "longpoll"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    mode = request.param
    data = Path(tmp_path_factory.mktemp(f"realtime-{mode}"))
    config = ClusterConfig(
        brokers=3,
        listen="127.0.0.1:0",
        data_dir=data,
        metrics=True,
        broker_args=NO_SWEEP_ARGS,  # only a wake on arrival answers a held request within these tests' bounds
        proxy_args=("--receive-mode", mode, "--min-invisible-s", "1"),
    )
    with Cluster(config) as c:
        yield c


def stubs(cluster: Cluster) -> dict[str, broker_pb2_grpc.BrokerStub]:
    return {
        name: broker_pb2_grpc.BrokerStub(grpc.insecure_channel(child.address))  # type: ignore[no-untyped-call]
        for name, child in cluster.brokers.items()
    }


def held(brokers: dict[str, broker_pb2_grpc.BrokerStub]) -> dict[str, int]:
    out = {}
    for name, stub in brokers.items():
        stats = stub.Stats(bpb.StatsRequest(), timeout=2)
        out[name] = stats.held_pops + stats.held_notifications
    return out


def wait_for(condition: Callable[[], bool], *, timeout_s: float = 5.0, what: str) -> None:
    """Poll a broker-side condition with a deadline (there is no event to wait on across processes)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def send_to(stub: broker_pb2_grpc.BrokerStub, topic: str, body: bytes, tag: str | None = None) -> None:
    message = bpb.Message(
        topic=topic, message_id=uuid.uuid4().hex.upper(), body=body, born_ms=int(time.time() * 1000), tag=tag
    )
    stub.Send(bpb.SendRequest(messages=[message]), timeout=5)


def receive(client: V2Client, topic: str, group: str) -> tuple[v2.Status, list[v2.Message]]:
    return client.receive(topic, group, batch=1, invisible_s=30, poll_s=POLL_S)


# Coupled long polling waits on one broker (the false empty this issue removes) and sends no
# Notifications, so these behaviours are required of the notify and adaptive modes only.
REALTIME_MODES = pytest.mark.parametrize("cluster", ["notify", "adaptive"], indirect=True)


@REALTIME_MODES
def test_a_long_poll_gets_a_message_from_any_broker_promptly(cluster: Cluster) -> None:
    brokers = stubs(cluster)
    client = V2Client(cluster.endpoint)
    topic, group = f"rt-{uuid.uuid4().hex[:8]}", "g-any"
    with ThreadPoolExecutor(1) as pool:
        for name, stub in brokers.items():
            waiting = pool.submit(receive, client, topic, group)
            wait_for(lambda: all(n > 0 for n in held(brokers).values()), what="a held notification on every broker")
            sent = time.monotonic()
            send_to(stub, topic, name.encode())
            status, messages = waiting.result(timeout=POLL_S + 5)
            took = time.monotonic() - sent
            assert status.code == v2.OK and [m.body for m in messages] == [name.encode()]
            assert took < 1.0, f"message on {name} took {took:.3f} s"
            client.ack(topic, group, messages)
    # Each answer released the other brokers' Notifications (cancelled once the frames were written).
    wait_for(lambda: sum(held(brokers).values()) == 0, timeout_s=3, what="the other Notifications to be cancelled")
    client.close()


def test_a_client_that_disconnects_mid_poll_leaves_no_held_request(cluster: Cluster) -> None:
    brokers = stubs(cluster)
    client = V2Client(cluster.endpoint)
    request = pb.ReceiveMessageRequest(
        group=v2.Resource(name="g-gone"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=f"gone-{uuid.uuid4().hex[:8]}")),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=1,
    )
    request.long_polling_timeout.seconds = POLL_S
    cancelled_before = broker_calls_cancelled(cluster)
    calls = [client.stub.ReceiveMessage(request, timeout=POLL_S + 3) for _ in range(3)]
    wait_for(lambda: sum(held(brokers).values()) >= 3, what="the receives to be held at the brokers")
    for call in calls:
        call.cancel()
    wait_for(lambda: sum(held(brokers).values()) == 0, timeout_s=3, what="every broker to drop its held requests")
    # The broker calls the proxy cancelled are counted as sent calls (a bench's "broker RPCs" reads this counter)
    wait_for(lambda: broker_calls_cancelled(cluster) - cancelled_before >= 3, what="cancelled broker calls counted")
    client.close()


def broker_calls_cancelled(cluster: Cluster) -> float:
    with urllib.request.urlopen(cluster.proxies[0].metrics_url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("popgate_proxy_broker_rpcs_total{") and 'outcome="cancelled"' in line
    )


@REALTIME_MODES
def test_two_consumers_race_for_one_message_the_other_gets_the_next(cluster: Cluster) -> None:
    brokers = stubs(cluster)
    first, second = V2Client(cluster.endpoint), V2Client(cluster.endpoint)
    topic, group = f"race-{uuid.uuid4().hex[:8]}", "g-race"
    with ThreadPoolExecutor(2) as pool:
        calls: list[Future[tuple[v2.Status, list[v2.Message]]]] = [
            pool.submit(receive, c, topic, group) for c in (first, second)
        ]
        wait_for(lambda: all(n >= 2 for n in held(brokers).values()), what="both receives watching every broker")
        send_to(brokers["b2"], topic, b"one")
        deadline = time.monotonic() + 2
        while not any(c.done() for c in calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        winners = [c for c in calls if c.done()]
        assert len(winners) == 1, "exactly one consumer gets the message"
        status, messages = winners[0].result()
        assert status.code == v2.OK and [m.body for m in messages] == [b"one"]
        loser = calls[1 - calls.index(winners[0])]
        # The loser keeps waiting: it watches every broker again.
        wait_for(lambda: all(n >= 1 for n in held(brokers).values()), what="the loser watching every broker")
        assert not loser.done()
        send_to(brokers["b3"], topic, b"two")
        status, messages = loser.result(timeout=2)
        assert status.code == v2.OK and [m.body for m in messages] == [b"two"]
    first.close()
    second.close()


@REALTIME_MODES
def test_messages_arriving_together_on_two_brokers_reach_two_waiting_consumers_at_once(cluster: Cluster) -> None:
    """Both receives watch every broker, the first one's Notifications held longest: each arrival wakes that one
    (one wake per message, oldest first), and it takes one message. The other broker's wake, unused, is handed
    back and passed on to the second consumer; it waited for the broker's 1 s sweep before, or (sweep off, as
    here) its whole long poll while a message sat ready (a review's probe)."""
    brokers = stubs(cluster)
    first, second = V2Client(cluster.endpoint), V2Client(cluster.endpoint)
    topic, group = f"pair-{uuid.uuid4().hex[:8]}", "g-pair"
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(receive, first, topic, group)]
        wait_for(lambda: all(n >= 1 for n in held(brokers).values()), what="the first receive watching every broker")
        calls.append(pool.submit(receive, second, topic, group))
        wait_for(lambda: all(n >= 2 for n in held(brokers).values()), what="both receives watching every broker")
        sent = time.monotonic()
        for sending in [pool.submit(send_to, brokers[b], topic, b.encode()) for b in ("b1", "b2")]:
            sending.result(timeout=5)
        answers = [call.result(timeout=POLL_S + 5) for call in calls]
        took = time.monotonic() - sent
        bodies = sorted(m.body for status, messages in answers for m in messages)
        assert bodies == [b"b1", b"b2"], answers
        assert took < 1.0, f"the second message took {took:.3f} s"
    first.close()
    second.close()


@REALTIME_MODES
def test_a_burst_on_two_brokers_reaches_every_waiting_consumer_at_once(cluster: Cluster) -> None:
    """6 consumers of a group waiting over 3 brokers, then 3 messages land on b1 and 3 on b2 at once: every
    consumer gets one, none waits on an empty b3 while a message sits ready. Adaptive: 3 notify runs and 3 long
    polls; a broker left without a long poll of the group is watched and one moves there (a review's probe had 2
    of 6 wait 11.9 s, with empty answers meanwhile)."""
    brokers = stubs(cluster)
    mode = cluster.config.proxy_args[1]
    # Settled: adaptive holds 3 Notifications and 1 long poll at each broker, notify 6 Notifications.
    held_when_waiting = {"adaptive": 3 + 1, "notify": 6}[mode]
    clients = [V2Client(cluster.endpoint) for _ in range(6)]
    topic, group = f"burst-{uuid.uuid4().hex[:8]}", "g-burst"
    with ThreadPoolExecutor(12) as pool:
        calls = []
        for client in clients:
            calls.append(pool.submit(receive, client, topic, group))
            n = len(calls)  # adaptive: 3 notify runs (one Notification per broker each), then 3 long polls
            least = 3 * n if mode == "notify" else 3 * min(n, 3) + max(0, n - 3)
            wait_for(lambda least=least: sum(held(brokers).values()) >= least, what=f"{n} receives waiting")
        # A watch covering a broker until its long poll lands is cancelled right after: wait for it to end.
        wait_for(
            lambda: set(held(brokers).values()) == {held_when_waiting}, what=f"{held_when_waiting} held at each broker"
        )
        sent = time.monotonic()
        sends = [pool.submit(send_to, brokers[b], topic, f"{b}-{i}".encode()) for b in ("b1", "b2") for i in range(3)]
        for sending in sends:
            sending.result(timeout=5)
        answers = [call.result(timeout=POLL_S + 5) for call in calls]
        took = time.monotonic() - sent
        assert sorted(len(messages) for _, messages in answers) == [1] * 6, answers
        assert took < 2.0, f"the last of the six took {took:.3f} s"
    for client in clients:
        client.close()


@REALTIME_MODES
def test_a_fifo_message_waits_for_the_ack_of_the_one_before_and_the_ack_wakes_the_waiting_consumer(
    cluster: Cluster,
) -> None:
    """Two consumers of one group, one message group: while the first holds m1, the second's long poll gets
    nothing (m2 waits behind m1 on its broker); the first's ack answers it with m2 at once."""
    brokers = stubs(cluster)
    first, second = V2Client(cluster.endpoint), V2Client(cluster.endpoint)
    topic, group = f"fifo-{uuid.uuid4().hex[:8]}", f"g-fifo-{uuid.uuid4().hex[:6]}"
    with Producer(cluster.endpoint) as producer:
        producer.send_many(topic, [b"m1", b"m2"], message_group="customer-7")
    status, messages = receive(first, topic, group)
    assert status.code == v2.OK and [m.body for m in messages] == [b"m1"]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(receive, second, topic, group)
        wait_for(lambda: all(n > 0 for n in held(brokers).values()), what="the second receive held on every broker")
        assert not waiting.done(), "m2 went out while m1 was in flight"
        acked = time.monotonic()
        first.ack(topic, group, messages)
        status, after = waiting.result(timeout=POLL_S + 5)
        took = time.monotonic() - acked
    assert status.code == v2.OK and [m.body for m in after] == [b"m2"]
    assert took < 1.0, f"m2 came {took:.3f} s after m1's ack"
    first.close()
    second.close()


def proxy_sample(cluster: Cluster, name: str, labels: dict[str, str]) -> float:
    with urllib.request.urlopen(cluster.proxies[0].metrics_url, timeout=5) as response:
        text = response.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            sample, value = line.rsplit(" ", 1)
            got = ",".join(sorted(sample[len(name) + 1 : -1].split(",")))
            if got == want:
                return float(value)
    return 0.0


@REALTIME_MODES
def test_notifications_honour_the_tag_filter(cluster: Cluster) -> None:
    """A message the consumer's filter rejects wakes no Notification (no has_message that no Pop can serve)."""
    brokers = stubs(cluster)
    client = V2Client(cluster.endpoint)
    topic, group = f"tags-{uuid.uuid4().hex[:8]}", f"g-tags-{uuid.uuid4().hex[:6]}"
    request = wire.receive_request(group, wire.Subscription(topic, "a"), max=1, invisible=30, wait=POLL_S)

    def receive_a() -> list[v2.Message]:
        return [f.message for f in client.stub.ReceiveMessage(request, timeout=POLL_S + 3) if f.HasField("message")]

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(receive_a)
        wait_for(lambda: all(n > 0 for n in held(brokers).values()), what="a held notification on every broker")
        send_to(brokers["b1"], topic, b"not for us", tag="b")
        send_to(brokers["b2"], topic, b"for us", tag="a")
        assert [m.body for m in waiting.result(timeout=2)] == [b"for us"]
    labels = {"group": group, "outcome": "has_message"}
    assert proxy_sample(cluster, "popgate_proxy_notifications_total", labels) == 1
    assert proxy_sample(cluster, "popgate_proxy_notify_pops_total", {"group": group, "kind": "lost"}) == 0
    client.close()


def test_a_receive_gets_only_what_its_tag_filter_accepts(cluster: Cluster) -> None:
    """Every mode passes the filter to the brokers: rejected messages are ready on every broker, ahead of the
    accepted ones, so a Pop that ignored the filter would return them."""
    brokers = stubs(cluster)
    client = V2Client(cluster.endpoint)
    topic, group = f"filter-{uuid.uuid4().hex[:8]}", f"g-filter-{uuid.uuid4().hex[:6]}"
    for name, stub in brokers.items():
        send_to(stub, topic, b"rejected", tag="b")
        send_to(stub, topic, name.encode(), tag="a")
    request = wire.receive_request(group, wire.Subscription(topic, "a"), max=32, invisible=30, wait=1)
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < len(brokers) and time.monotonic() < deadline:
            frames = client.stub.ReceiveMessage(request, timeout=5)
            got += [f.message.body for f in frames if f.HasField("message")]
    finally:
        client.close()
    assert sorted(got) == sorted(name.encode() for name in brokers)


@pytest.mark.parametrize("cluster", ["adaptive"], indirect=True)
def test_a_receive_that_waits_longer_gets_the_message_whether_it_holds_a_notification_or_a_pop(
    cluster: Cluster,
) -> None:
    """A quiet group's first receives hold Notifications (pop with notify); once as many are in progress as there
    are brokers, its next ones hold Pops (coupled long polling). The broker wakes the oldest either way: before,
    held Pops went first, so a second official PushConsumer of a group took every message while the first one's
    receives waited their whole poll (a review's probe: 0 of 200 messages for 20 s)."""
    brokers = stubs(cluster)
    client = V2Client(cluster.endpoint)
    topic, group = f"fair-{uuid.uuid4().hex[:8]}", "g-fair"
    request = wire.receive_request(group, wire.Subscription(topic), max=1, invisible=30, wait=POLL_S)
    calls = []

    def answer(call: Any) -> list[bytes]:
        try:
            return [frame.message.body for frame in call if frame.HasField("message")]
        except grpc.RpcError:
            return []  # cancelled below

    with ThreadPoolExecutor(6) as pool:
        answers = []
        for expected in (3, 6, 9, 10, 11, 12):  # three receives hold Notifications at every broker, three a Pop each
            call = client.stub.ReceiveMessage(request, timeout=POLL_S + 3)
            calls.append(call)
            answers.append(pool.submit(answer, call))
            wait_for(lambda n=expected: sum(held(brokers).values()) >= n, what=f"{expected} requests held")
        try:
            send_to(brokers["b1"], topic, b"one")
            wait_for(lambda: any(a.done() for a in answers), what="a receive to get the message")
            got = [i for i, a in enumerate(answers) if a.done() and a.result() == [b"one"]]
            assert got and got[0] < 3, f"receive {got} got it: a later one, holding a Pop, went first"
        finally:
            for call in calls:
                call.cancel()
    client.close()


@pytest.mark.parametrize("cluster", ["adaptive"], indirect=True)
def test_a_long_poll_gets_a_message_for_its_filter_at_a_broker_holding_only_another_filters_long_poll(
    cluster: Cluster,
) -> None:
    """Consumers of one group with filters a and b: three receives with a hold Notifications, then one with b and
    one with a hold a Pop each. A message for b lands where only the Pop with a is held: the receive with b gets it
    at once (a review's probe: answered empty 7.2 s later, with 8 s polls, the message still there)."""
    brokers = stubs(cluster)
    client = V2Client(cluster.endpoint)
    topic, group = f"mixed-{uuid.uuid4().hex[:8]}", f"g-mixed-{uuid.uuid4().hex[:6]}"

    def pops() -> dict[str, int]:
        return {name: stub.Stats(bpb.StatsRequest(), timeout=2).held_pops for name, stub in brokers.items()}

    def start(tag: str) -> Any:
        request = wire.receive_request(group, wire.Subscription(topic, tag), max=1, invisible=30, wait=POLL_S)
        return client.stub.ReceiveMessage(request, timeout=POLL_S + 3)

    def answer(call: Any) -> list[bytes]:
        try:
            return [frame.message.body for frame in call if frame.HasField("message")]
        except grpc.RpcError:
            return []  # cancelled below

    calls = []
    with ThreadPoolExecutor(5) as pool:
        try:
            for n in (1, 2, 3):  # notify runs: one Notification at every broker each
                calls.append(start("a"))
                pool.submit(answer, calls[-1])
                wait_for(lambda n=n: all(h >= n for h in held(brokers).values()), what=f"{n} notify runs")
            calls.append(start("b"))
            for_b = pool.submit(answer, calls[-1])
            wait_for(lambda: sum(pops().values()) == 1, what="the receive with b holding a Pop")
            at_b = next(name for name, count in pops().items() if count)
            wait_for(lambda: all(h >= 4 for h in held(brokers).values()), what="the other brokers watched for b")
            calls.append(start("a"))
            pool.submit(answer, calls[-1])
            wait_for(lambda: sum(pops().values()) == 2, what="the receive with a holding a Pop")
            held_pops = pops()
            others = [name for name in brokers if name != at_b]
            target = next((name for name in others if held_pops[name]), others[0])  # the one with a, if not at_b
            sent = time.monotonic()
            send_to(brokers[target], topic, b"for b", tag="b")
            assert for_b.result(timeout=POLL_S + 5) == [b"for b"]
            took = time.monotonic() - sent
            assert took < 1.0, f"the message for b on {target} took {took:.3f} s"
        finally:
            for call in calls:
                call.cancel()
    client.close()
