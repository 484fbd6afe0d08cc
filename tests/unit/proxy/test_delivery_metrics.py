"""What consumers got, counted where the proxy writes answers and serves acks (docs/METRICS.md §4, proxy)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from prometheus_client import CollectorRegistry, Histogram

from popgate_contract import errors
from proxy.core import Proxy
from proxy.metrics import DELIVERY_LATENCY_BUCKETS, ProxyMetrics
from proxy.receive.adaptive import AdaptivePolicy, AdaptiveSettings
from proxy.receive.adaptive_driver import AdaptiveStrategy
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.notify_driver import NotifyStrategy
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings
from proxy.v2 import receive
from proxy.v2.ack import ack_message
from proxy.v2.context import Call, endpoints_for
from tests.unit.process.exposition import created_series, family_samples
from tests.unit.proxy.fakes import FakeBroker, Frames, handle, popped

NOW_MS = 1_700_000_000_123 + 2_000  # two seconds after the fakes' store time


def sample(metrics: ProxyMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_first_deliveries_and_redeliveries_are_counted_apart_with_bytes_and_latency() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    delayed = popped("b1", "m3", body=b"abcd")
    delayed.stored.message.deliver_at_ms = NOW_MS - 500  # due half a second before: latency from its due time
    answer = [popped("b1", "m1", body=b"12345"), popped("b1", "m2", body=b"123", attempt=3), delayed]
    metrics.delivered("t", "g", answer, NOW_MS)
    delivered = "popgate_proxy_messages_delivered_total"
    assert sample(metrics, delivered, topic="t", group="g", delivery="first") == 2
    assert sample(metrics, delivered, topic="t", group="g", delivery="redelivery") == 1
    assert sample(metrics, "popgate_proxy_delivered_bytes_total", topic="t", group="g") == 12
    latency = "popgate_proxy_first_delivery_latency_seconds"
    assert sample(metrics, f"{latency}_count", topic="t", group="g") == 2  # first deliveries only
    assert sample(metrics, f"{latency}_sum", topic="t", group="g") == 2.5
    assert sample(metrics, f"{latency}_bucket", topic="t", group="g", le="0.5") == 1


def test_a_store_time_ahead_of_the_proxy_clock_counts_as_no_latency() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.delivered("t", "g", [popped("b1", "m1")], 1_700_000_000_000)  # 123 ms before the store time
    latency = "popgate_proxy_first_delivery_latency_seconds"
    assert sample(metrics, f"{latency}_sum", topic="t", group="g") == 0
    assert sample(metrics, f"{latency}_bucket", topic="t", group="g", le="0.01") == 1


def test_pairs_beyond_the_label_limit_share_the_other_topic() -> None:
    """A client names topic and group: the label sets a proxy keeps for its whole life stay bounded."""
    metrics = ProxyMetrics(CollectorRegistry(), max_groups=2, max_topic_groups=2)
    for topic, group in (("t1", "a"), ("t2", "a"), ("t3", "a"), ("t1", "b"), ("t1", "c")):
        metrics.delivered(topic, group, [popped("b1", "m")], NOW_MS)
    first = "popgate_proxy_messages_delivered_total"
    counted = {
        (s.labels["topic"], s.labels["group"]): s.value
        for family in metrics.registry.collect()
        if family.name == first.removesuffix("_total")
        for s in family.samples
        if s.name == first
    }
    assert counted == {("t1", "a"): 1, ("t2", "a"): 1, ("_other", "a"): 1, ("_other", "b"): 1, ("_other", "_other"): 1}


LATENCY = "popgate_proxy_first_delivery_latency_seconds"
BOUNDS_MS = [round(bound * 1000) for bound in DELIVERY_LATENCY_BUCKETS]
latencies_ms = st.one_of(
    st.sampled_from(BOUNDS_MS), st.sampled_from([ms + 1 for ms in BOUNDS_MS]), st.integers(-2_000, 5_000_000)
)
# (latency from its store, latency from its delivery time if delayed, delivery attempt) of each message of an answer
answers = st.lists(
    st.tuples(
        st.sampled_from([("t", "g"), ("t", "h"), ("u", "g")]),
        st.lists(st.tuples(latencies_ms, st.none() | latencies_ms, st.sampled_from([1, 1, 2])), max_size=40),
    ),
    max_size=12,
)


def latency_samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float | None]]:
    return family_samples(registry, LATENCY)


@pytest.mark.parametrize("created", [True, False])
@given(answers=answers)
def test_the_latency_histogram_exports_what_a_prometheus_histogram_does(
    created: bool, answers: list[tuple[tuple[str, str], list[tuple[int, int | None, int]]]]
) -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    reference = CollectorRegistry()
    histogram = Histogram(LATENCY, "", ["topic", "group"], buckets=DELIVERY_LATENCY_BUCKETS, registry=reference)
    for (topic, group), messages in answers:
        answer, child = [], histogram.labels(topic, group)
        for i, (stored_ms, due_ms, attempt) in enumerate(messages):
            message = popped("b1", f"m{i}", attempt=attempt)
            message.stored.store_ms = NOW_MS - stored_ms
            if due_ms is not None:
                message.stored.message.deliver_at_ms = NOW_MS - due_ms
            answer.append(message)
            if attempt == 1:
                child.observe(max(min(stored_ms, stored_ms if due_ms is None else due_ms), 0) / 1000)
        metrics.delivered(topic, group, answer, NOW_MS)
    with created_series(created):
        exported = latency_samples(metrics.registry)
        assert exported == latency_samples(reference)
    assert any(name.endswith("_created") for name, _, _ in exported) == (created and bool(answers))


def test_a_scrape_sees_whole_answers_counted() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    answer = [popped("b1", f"m{i}") for i in range(32)]  # 2 s each since their store
    done = threading.Event()
    scraped: list[dict[str, float]] = []

    def scrape() -> None:
        while not done.is_set():
            scraped.append({name: value for name, _, value in latency_samples(metrics.registry) if value is not None})

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for _ in range(2_000):
            metrics.delivered("t", "g", answer, NOW_MS)
    finally:
        done.set()
        scraper.join(timeout=10)
    assert scraped and not scraper.is_alive()
    for seen in scraped:
        count = seen.get(f"{LATENCY}_count", 0)
        assert count % 32 == 0 and seen.get(f"{LATENCY}_sum", 0) == 2 * count


def test_acks_are_counted_by_outcome() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.acked("t", "g", [None, errors.InvalidReceiptHandle("stale"), None])
    assert sample(metrics, "popgate_proxy_acks_total", topic="t", group="g", outcome="ok") == 2
    assert sample(metrics, "popgate_proxy_acks_total", topic="t", group="g", outcome="InvalidReceiptHandle") == 1


def edge(metrics: ProxyMetrics) -> tuple[Call, FakeBroker]:
    broker = FakeBroker("b1")
    pool = BrokerPool({"b1": broker}, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), metrics=metrics)
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    return Call(proxy, settings, endpoints_for("127.0.0.1:1"), None), broker


async def receive_message(call: Call, request: pb.ReceiveMessageRequest, write: receive.Write) -> int:
    """One receive answered, as the servicer's ReceiveMessage does it."""
    asked = receive.build_request(call, request)
    return await receive.answer(call, asked, await call.proxy.receive(asked), write)


def receive_request() -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(group=v2.Resource(name="g"), batch_size=8)
    request.message_queue.topic.name = "t"
    request.long_polling_timeout.FromMilliseconds(0)
    return request


async def test_an_answer_read_whole_is_counted_one_cut_off_before_its_status_is_not() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    call, broker = edge(metrics)
    broker.put(popped("b1", "m1", body=b"abc"), popped("b1", "m2", body=b"de", attempt=2))
    written = Frames()
    assert await receive_message(call, receive_request(), written.write) == v2.OK
    assert written.frames[-1].status.code == v2.OK
    delivered = "popgate_proxy_messages_delivered_total"
    assert sample(metrics, delivered, topic="t", group="g", delivery="first") == 1
    assert sample(metrics, delivered, topic="t", group="g", delivery="redelivery") == 1
    assert sample(metrics, "popgate_proxy_delivered_bytes_total", topic="t", group="g") == 5
    seconds = sample(metrics, "popgate_proxy_first_delivery_latency_seconds_sum", topic="t", group="g")
    assert seconds is not None and seconds >= time.time() - 1_700_000_001  # from the fakes' store time

    broker.put(popped("b1", "m3"))
    stalled = Frames(stall_at=1)  # the delivery_timestamp frame, then the client goes away during the message's
    answer = asyncio.create_task(receive_message(call, receive_request(), stalled.write))
    await stalled.stalled.wait()
    answer.cancel()
    await asyncio.gather(answer, return_exceptions=True)
    assert sample(metrics, delivered, topic="t", group="g", delivery="first") == 1


async def test_an_answer_given_back_during_its_last_joined_write_counts_no_delivery() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    call, broker = edge(metrics)
    call = dataclasses.replace(call, settings=dataclasses.replace(call.settings, max_answer_write_s=0.05))
    broker.put(popped("b1", "m1"), popped("b1", "m2", attempt=2))

    async def slow_last(frame: object) -> None:  # a client that reads the last frame after the write deadline
        if isinstance(frame, receive.Joined):
            await asyncio.sleep(0.2)

    asked = receive.build_request(call, receive_request())
    await receive.answer(call, asked, await call.proxy.receive(asked), slow_last, receive.SESSION_BATCH)
    delivered = "popgate_proxy_messages_delivered_total"
    assert sample(metrics, delivered, topic="t", group="g", delivery="first") is None
    assert sample(metrics, delivered, topic="t", group="g", delivery="redelivery") is None
    assert not sample(metrics, f"{LATENCY}_count", topic="t", group="g")


async def test_the_ack_edge_counts_each_entry() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    call, _ = edge(metrics)
    request = pb.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="t"))
    request.entries.add(message_id="m1", receipt_handle=handle("b1"))
    request.entries.add(message_id="m2", receipt_handle=handle("b1", token="5a1e"))  # stale at the fake
    answer = await ack_message(call, request)
    assert answer.status.code == v2.MULTIPLE_RESULTS
    assert sample(metrics, "popgate_proxy_acks_total", topic="t", group="g", outcome="ok") == 1
    assert sample(metrics, "popgate_proxy_acks_total", topic="t", group="g", outcome="InvalidReceiptHandle") == 1


def adaptive_edge(metrics: ProxyMetrics) -> tuple[Call, FakeBroker]:
    """`edge` with the default receive mode (adaptive over notify and long polling), every strategy counting."""
    broker = FakeBroker("b1")
    pool = BrokerPool({"b1": broker}, first_turn=0)
    notify = NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics)
    longpoll = LongPollStrategy(pool, broker_timeout_s=1.0, metrics=metrics)
    adaptive = AdaptiveStrategy(pool, AdaptivePolicy(AdaptiveSettings()), notify, longpoll, metrics=metrics)
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    return Call(Proxy(pool, adaptive, metrics=metrics), settings, endpoints_for("127.0.0.1:1"), None), broker


async def test_refused_receives_and_acks_take_no_label_from_a_group_a_broker_serves() -> None:
    """Receives of a topic no broker has and acks of garbage handles, each under made-up names, fill none of the
    proxy's label slots: a group served afterwards keeps its own labels."""
    metrics = ProxyMetrics(CollectorRegistry(), max_groups=2, max_topic_groups=2)
    call, broker = adaptive_edge(metrics)
    broker.fail = errors.TopicNotFound("no such topic")
    for i in range(3):
        junk = receive_request()
        junk.group.name, junk.message_queue.topic.name = f"junk-{i}", f"nope-{i}"
        with pytest.raises(errors.TopicNotFound):  # the servicer answers TOPIC_NOT_FOUND
            await receive_message(call, junk, Frames().write)
        ack = pb.AckMessageRequest(group=v2.Resource(name=f"junk-{i}"), topic=v2.Resource(name=f"nope-{i}"))
        ack.entries.add(message_id="X", receipt_handle="garbage")
        assert (await ack_message(call, ack)).status.code == v2.INVALID_RECEIPT_HANDLE
    broker.fail = None
    broker.put(popped("b1", "m1"))
    assert await receive_message(call, receive_request(), Frames().write) == v2.OK
    ack = pb.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="t"))
    ack.entries.add(message_id="m1", receipt_handle=handle("b1"))
    assert (await ack_message(call, ack)).status.code == v2.OK
    assert sample(metrics, "popgate_proxy_receives_total", group="g", mode="adaptive", outcome="messages") == 1
    assert sample(metrics, "popgate_proxy_receive_mode_decisions_total", group="g", mode="notify", reason="quiet") == 1
    assert sample(metrics, "popgate_proxy_notify_runs_total", group="g") == 1
    assert sample(metrics, "popgate_proxy_messages_delivered_total", topic="t", group="g", delivery="first") == 1
    assert sample(metrics, "popgate_proxy_acks_total", topic="t", group="g", outcome="ok") == 1
    refused = sample(metrics, "popgate_proxy_receives_total", group="_other", mode="adaptive", outcome="error")
    assert refused == 3
    decided = "popgate_proxy_receive_mode_decisions_total"
    assert sample(metrics, decided, group="_other", mode="notify", reason="quiet") == 3
    assert (
        sample(metrics, "popgate_proxy_acks_total", topic="_other", group="_other", outcome="InvalidReceiptHandle") == 3
    )


def test_each_receive_counts_its_own_mode_decision_under_the_label_its_outcome_gives() -> None:
    """Three receives of a group without a label yet decide their mode; the first ends refused while the others
    wait, then they are served: one decision under _other, two under the group's own label, none left kept."""
    metrics = ProxyMetrics(CollectorRegistry())
    receives = [object() for _ in range(3)]
    for request in receives:
        metrics.mode_decision("g", "notify", "quiet", request=request)
    metrics.receive("g", "adaptive", "full", 0.0, request=receives[0])
    for request in receives[1:]:
        metrics.receive("g", "adaptive", "empty", 0.5, request=request)
    decided = "popgate_proxy_receive_mode_decisions_total"
    assert sample(metrics, decided, group="_other", mode="notify", reason="quiet") == 1
    assert sample(metrics, decided, group="g", mode="notify", reason="quiet") == 2
    assert not metrics._labels._pending
