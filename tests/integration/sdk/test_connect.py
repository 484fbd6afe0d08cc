"""Connections whose handshake is slow (a server far away, TLS): the SDK's channel to a proxy and the proxy's
channel to a broker still connect. A forwarder that answers nothing for 1.5 s stands in for the distance."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk import Producer, RetryPolicy, SimpleConsumer
from sdk.cluster import Cluster, ClusterConfig
from tests.integration.sdk.conftest import drain
from tests.procs import ServerProcess

SLOW_S = 1.5  # over the 1 s cap of both channels' reconnect back-off


class SlowForwarder:
    """127.0.0.1:<port> → `target`, each connection silent for `delay_s` before bytes flow either way."""

    def __init__(self, target: str, delay_s: float) -> None:
        self.host, port = target.rsplit(":", 1)
        self.target_port = int(port)
        self.delay_s = delay_s
        self.writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        await asyncio.sleep(self.delay_s)
        up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        self.writers.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for writer in self.writers:
                writer.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def slow(cluster: Cluster) -> Iterator[SlowForwarder]:
    forwarder = SlowForwarder(cluster.endpoint, SLOW_S)
    yield forwarder
    forwarder.close()


def test_the_sdk_reaches_a_proxy_whose_handshake_is_slow(slow: SlowForwarder) -> None:
    with Producer(slow.address, request_timeout=5) as producer:
        assert producer.send("slow-handshake", b"x").message_id


def test_the_proxy_reaches_a_broker_whose_handshake_is_slow(tmp_path: Path) -> None:
    broker = ServerProcess("broker", ["--name", "b1", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "b1")])
    broker.start()
    forwarder = SlowForwarder(broker.address, SLOW_S)
    (tmp_path / "proxy").mkdir()
    cluster = Cluster(ClusterConfig(brokers=0, listen="127.0.0.1:0", data_dir=tmp_path / "proxy"))
    try:
        cluster.add_proxy("127.0.0.1:0", ["--broker", f"b1={forwarder.address}"])
        patient = RetryPolicy(max_attempts=20)
        with (
            Producer(cluster.endpoint, retry=patient) as producer,
            SimpleConsumer(cluster.endpoint, "g", "far", retry=patient) as consumer,
        ):
            producer.send("far", b"over a slow link")
            assert [m.body for m in drain(consumer, 1, timeout=30)] == [b"over a slow link"]
    finally:
        cluster.stop()
        forwarder.close()
        broker.stop()
