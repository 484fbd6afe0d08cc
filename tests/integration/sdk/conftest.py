"""A real `popgate up`-style cluster (2 brokers + proxy, popgate.cli.cluster) shared by this package; always torn down.

Tests use fresh topic and group names, so they do not see each other's messages. The restart tests
start their own cluster.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from popgate import Message, SendReceipt, SimpleConsumer, aio
from popgate.cli.cluster import Cluster, ClusterConfig

T = TypeVar("T")
# Short polls keep drains quick whatever the proxy's receive mode (in longpoll mode a poll on a drained
# broker waits its whole time while the other broker still has messages: a "false empty", docs/ARCHITECTURE.md §3).
WAIT = 0.4
PROXY_ARGS = ("--min-invisible-s", "1", "--shutdown-grace-s", "0.5")
# Brokers wait their whole shutdown grace on SIGTERM even when idle (5 s by default): keep teardown short.
BROKER_ARGS = ("--shutdown-grace-s", "0.5")


def start_cluster(data_dir: Path, brokers: int = 2, broker_args: Sequence[str] = ()) -> Cluster:
    config = ClusterConfig(
        brokers=brokers,
        listen="127.0.0.1:0",
        data_dir=data_dir,
        proxy_args=PROXY_ARGS,
        broker_args=(*BROKER_ARGS, *broker_args),
        flush="async",
        receive_mode="adaptive",  # the proxy's default
    )
    cluster = Cluster(config)
    cluster.start()
    return cluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def endpoint(cluster: Cluster) -> str:
    return cluster.endpoint


def eventually(probe: Callable[[], T | None], timeout: float = 10.0, what: str = "condition") -> T:
    """Call probe until it returns something other than None (each call may block briefly); bounded."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")


def drain(consumer: SimpleConsumer, count: int, *, timeout: float = 15.0, ack: bool = True) -> list[Message]:
    """Receive until `count` messages came (or fail after `timeout`); ack them unless told not to."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"received {len(got)} of {count} messages within {timeout} s"
        batch = consumer.receive(max=32, wait=min(WAIT, left))
        if batch and ack:
            consumer.ack_many(batch)
        got += batch
    return got


# A consumer's invisible time far longer than any drain: a message received again within one was given back.
LONG_INVISIBLE = 60.0


def record_batches(consumer: SimpleConsumer | aio.SimpleConsumer) -> list[list[Message]]:
    """Every batch the consumer's receives return from now on (those of its iterations too), in order."""
    batches: list[list[Message]] = []
    receive_once = consumer._receive_once

    if isinstance(consumer, aio.SimpleConsumer):

        async def recorded_async(*args: Any, **kwargs: Any) -> list[Message]:
            batches.append(await receive_once(*args, **kwargs))
            return batches[-1]

        consumer._receive_once = recorded_async  # type: ignore[method-assign]
    else:

        def recorded(*args: Any, **kwargs: Any) -> list[Message]:
            batches.append(receive_once(*args, **kwargs))
            return batches[-1]

        consumer._receive_once = recorded  # type: ignore[method-assign]
    return batches


def given_back_attempts(sent: list[SendReceipt], handled: list[Message], given_back: list[Message]) -> dict[str, int]:
    """The attempt each message not handled should come with next: 1, as those never received, for those given
    back (undelivered through popgate's proxy: the application never saw them, so no delivery is counted)."""
    done = {m.message_id for m in handled} - {m.message_id for m in given_back}
    return {r.message_id: 1 for r in sent if r.message_id not in done}


class Collector:
    """Iterates a consumer in a thread (`for msg in consumer`), acking and collecting every message."""

    def __init__(self, consumer: SimpleConsumer) -> None:
        self.consumer = consumer
        self.messages: queue.Queue[Message] = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for message in self.consumer:
                self.consumer.ack(message)
                self.messages.put(message)
        except BaseException as exc:  # surfaced by the test through .error
            self.error = exc

    def next_body(self, timeout: float = 20.0) -> bytes:
        try:
            return self.messages.get(timeout=timeout).body
        except queue.Empty:
            raise AssertionError(f"no message within {timeout} s; iterator error: {self.error!r}") from None

    def stop(self) -> None:
        self.consumer.close()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the iterator did not end after close()"


def name(prefix: str) -> str:
    """A fresh topic or group name."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def v2_only(cluster: Cluster) -> Iterator[str]:
    """A second proxy over the package's brokers that serves v2 alone (no popgate extension: as a RocketMQ proxy)."""
    endpoint = cluster.add_proxy(extra=("--no-batch-receive",))
    yield endpoint
    proxy = cluster.proxies.pop()
    proxy.stop()
