"""The SDK through a proxy whose client connections age (`--max-connection-age-s`): its Session streams move to
new connections with nothing lost and no call failed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from popgate import RetryPolicy, aio
from popgate.cli.cluster import Cluster, ClusterConfig
from tests.integration.sdk.conftest import BROKER_ARGS, PROXY_ARGS, name

# Ages longer than a receive waits (0.2 s): a receive is cut once at most, and sent again (as in use: minutes).
AGE_ARGS = ("--max-connection-age-s", "0.8", "--max-connection-age-grace-s", "5")


# On grpcio's server (grpc-core's own connection age) a Session stream is not told: it is cut at the grace's end and
# the SDK sends its requests in progress again.
SERVERS = {"h2": (), "grpcio": ("--server", "grpcio", "--max-connection-age-grace-s", "0.5")}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def aged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = ClusterConfig(
        brokers=1,
        listen="127.0.0.1:0",
        data_dir=tmp_path_factory.mktemp("aged"),
        proxy_args=(*PROXY_ARGS, *AGE_ARGS, *SERVERS[request.param]),
        broker_args=BROKER_ARGS,
        flush="async",
    )
    with Cluster(config) as cluster:
        yield cluster.endpoint


async def test_a_client_follows_its_sessions_to_new_connections_as_they_age(aged: str) -> None:
    """Connections told to go away every ~0.8 s while a producer sends and a consumer receives and acks: each
    Session drains (a receive in progress is cut, its messages given back, and sent again on the next stream), and
    every message sent arrives with no call failing."""
    topic, group = name("t"), name("g")
    async with aio.Producer(aged) as producer, aio.SimpleConsumer(aged, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
        sent: list[str] = []

        async def produce() -> None:
            for i in range(150):
                sent.append((await producer.send(topic, b"m%d" % i)).message_id)
                await asyncio.sleep(0.02)

        producing = asyncio.create_task(produce())
        got: set[str] = set()
        async with asyncio.timeout(60):
            while not producing.done() or not got >= set(sent):
                batch = await consumer.receive(max=32, wait=0.2)
                if batch:
                    await consumer.ack_many(batch)
                got |= {m.message_id for m in batch}
        await producing
        served = (producer._session_served, consumer._session_served)
    assert got == set(sent)
    assert served == (True, True)


@pytest.mark.parametrize("aged", ["h2"], indirect=True)  # grpcio's server cuts a Session stream, telling nothing
async def test_a_receive_waiting_longer_than_connections_live_waits_out_its_wait_across_them(aged: str) -> None:
    """A receive waiting several connection ages (connections told to go away every ~0.8 s), retrying nothing
    (`max_attempts=1`): each stream that ends under it asks again for the rest of its wait on the next, so a message
    sent late in the wait arrives in that same receive, and one on an empty topic answers empty once its wait is
    over instead of failing."""
    topic, group = name("t"), name("g")
    once = RetryPolicy(max_attempts=1)  # on the h2 server, no end of a stream a connection's age caused is one
    async with aio.Producer(aged) as producer, aio.SimpleConsumer(aged, group, topic, retry=once) as consumer:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await consumer.receive(max=1, wait=2.5) == []
        waited = loop.time() - started

        async def send_late() -> str:
            await asyncio.sleep(2.5)
            return (await producer.send(topic, b"late")).message_id

        sending = asyncio.create_task(send_late())
        got = await consumer.receive(max=1, wait=6)
        sent = await sending
        await consumer.ack_many(got)
    assert [m.message_id for m in got] == [sent]
    assert waited >= 2.4  # empty only once its wait was over
