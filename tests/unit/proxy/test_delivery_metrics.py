"""What consumers got, counted where the proxy writes answers and serves acks (docs/METRICS.md §4, proxy)."""

from __future__ import annotations

import time

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from prometheus_client import CollectorRegistry

from popgate_contract import errors
from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.receive.coupled import LongPollStrategy
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings
from proxy.v2.ack import ack_message
from proxy.v2.context import Call, endpoints_for
from proxy.v2.receive import receive_message
from tests.unit.proxy.fakes import FakeBroker, handle, popped

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


def receive_request() -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(group=v2.Resource(name="g"), batch_size=8)
    request.message_queue.topic.name = "t"
    request.long_polling_timeout.FromMilliseconds(0)
    return request


async def test_an_answer_read_whole_is_counted_one_cut_off_before_its_status_is_not() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    call, broker = edge(metrics)
    broker.put(popped("b1", "m1", body=b"abc"), popped("b1", "m2", body=b"de", attempt=2))
    frames = [frame async for frame in receive_message(call, receive_request())]
    assert frames[-1].status.code == v2.OK
    delivered = "popgate_proxy_messages_delivered_total"
    assert sample(metrics, delivered, topic="t", group="g", delivery="first") == 1
    assert sample(metrics, delivered, topic="t", group="g", delivery="redelivery") == 1
    assert sample(metrics, "popgate_proxy_delivered_bytes_total", topic="t", group="g") == 5
    seconds = sample(metrics, "popgate_proxy_first_delivery_latency_seconds_sum", topic="t", group="g")
    assert seconds is not None and seconds >= time.time() - 1_700_000_001  # from the fakes' store time

    broker.put(popped("b1", "m3"))
    answer = receive_message(call, receive_request())
    await anext(answer)  # the delivery_timestamp frame
    await anext(answer)  # the message, then the client goes away before the status
    await answer.aclose()
    assert sample(metrics, delivered, topic="t", group="g", delivery="first") == 1


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
