"""`for msg in consumer` carries on across a proxy restart and a broker restart (own cluster: it gets broken)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate import Producer, RetryPolicy, SimpleConsumer, Unavailable
from popgate.cli.cluster import Child, Cluster
from tests.integration.sdk.conftest import Collector, start_cluster

# Producers in these tests keep retrying for up to ~30 s while a server is down.
PATIENT = RetryPolicy(max_attempts=60, initial_backoff=0.05, max_backoff=0.5)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("faulty"))
    try:
        yield c
    finally:
        c.stop()


def restart_proxy(cluster: Cluster, *, kill: bool) -> None:
    """Stop the proxy (SIGTERM or kill -9) and start a new one on the same address."""
    old = cluster.proxies[0]
    if kill:
        old.kill()
    else:
        old.stop()
    start_proxy_again(cluster, old)


def start_proxy_again(cluster: Cluster, old: Child) -> None:
    """A stopped proxy's successor on its address: a fresh Child, not the old one restarted (the old one's
    stderr reader may still be finishing)."""
    address = old.address
    argv = list(old.argv)
    argv[argv.index("--listen") + 1] = address
    new = Child(old.name, argv, old.log_path)
    new.start(dict(cluster._env))
    cluster.proxies[0] = new
    assert new.wait_ready(30) == address


def restart_broker(cluster: Cluster, name: str) -> None:
    """Start a killed broker again on its address and data (a fresh Child, as in restart_proxy)."""
    old = cluster.brokers[name]
    new = Child(name, cluster._broker_argv(name, old.address), old.log_path)
    new.start(dict(cluster._env))
    cluster.brokers[name] = new
    assert new.wait_ready(30) == old.address


def test_iterator_carries_on_across_a_proxy_restart(faulty: Cluster, tmp_path: Path) -> None:
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    endpoint = faulty.endpoint
    collector = Collector(SimpleConsumer(endpoint, group, topic, wait=1.0))
    try:
        with Producer(endpoint, retry=PATIENT) as producer:
            producer.send(topic, b"before")
            assert collector.next_body() == b"before"
            restart_proxy(faulty, kill=False)
            producer.send(topic, b"after graceful restart")
            assert collector.next_body() == b"after graceful restart"
            restart_proxy(faulty, kill=True)
            producer.send(topic, b"after kill -9")
            assert collector.next_body() == b"after kill -9"
    finally:
        collector.stop()
    assert collector.error is None


def test_a_producer_reconnects_to_a_restarted_proxy_within_its_retries(faulty: Cluster) -> None:
    """A producer sending all along, with a short retry budget (three attempts, 0.15 s of back-off): once the
    proxy is back, its sends go through again. A sync channel on grpc's poller I/O reconnects only while it is
    polled: left alone between retries, it came back 6-10 s after the proxy did, and every send failed meanwhile."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    outcomes: list[tuple[float, bool]] = []  # (when the send started, whether it went through)
    stop = threading.Event()
    with Producer(faulty.endpoint, retry=RetryPolicy(max_attempts=3, initial_backoff=0.05)) as producer:

        def keep_sending() -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    producer.send(topic, b"x")
                    outcomes.append((started, True))
                except Unavailable:
                    outcomes.append((started, False))
                time.sleep(0.05)

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        old = faulty.proxies[0]
        old.kill()
        time.sleep(1)  # sends fail meanwhile
        start_proxy_again(faulty, old)
        back = time.monotonic()
        time.sleep(5)
        stop.set()
        sender.join(15)
    assert not all(ok for _, ok in outcomes), "no send failed while the proxy was down"
    settled = [ok for started, ok in outcomes if started >= back + 1]  # a second to notice it is back
    assert settled and all(settled), f"{settled.count(False)} of {len(settled)} sends failed 1-5 s after the restart"


def test_iterator_carries_on_across_a_broker_restart(faulty: Cluster) -> None:
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    endpoint = faulty.endpoint
    collector = Collector(SimpleConsumer(endpoint, group, topic, wait=1.0))
    try:
        with Producer(endpoint, retry=PATIENT) as producer:
            producer.send_many(topic, [f"a{i}".encode() for i in range(10)])
            first = {collector.next_body() for _ in range(10)}
            assert first == {f"a{i}".encode() for i in range(10)}
            faulty.brokers["b1"].kill()  # kill -9
            producer.send_many(topic, [f"b{i}".encode() for i in range(10)])  # fails over to b2
            during = {collector.next_body() for _ in range(10)}
            restart_broker(faulty, "b1")
            later = {f"c{i}".encode() for i in range(40)}
            producer.send_many(topic, sorted(later))
            after = bodies_until(collector, later)
    finally:
        collector.stop()
    assert during == {f"b{i}".encode() for i in range(10)}
    # At least once: the kill -9 may have lost the acks of b1's last moments (docs/BROKER.md, "When state is
    # durable"), so some of the first messages may come again; nothing else does.
    assert after - later <= first
    assert collector.error is None


def bodies_until(collector: Collector, wanted: set[bytes]) -> set[bytes]:
    """The bodies the collector yields until it has yielded every one of `wanted` (each waited for at most 20 s)."""
    seen: set[bytes] = set()
    while not wanted <= seen:
        seen.add(collector.next_body())
    return seen
