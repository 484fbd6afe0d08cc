"""The broker's ack latency histogram exports what the prometheus_client Histogram it replaced did."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from broker.metrics import ACK_BUCKETS, MAX_LATENCY_PAIRS, OTHER, BrokerMetrics
from tests.unit.process.exposition import created_series

NAME = "popgate_broker_ack_latency_seconds"
HELP = (
    f"Time from a message's store to its ack, per topic and group (beyond {MAX_LATENCY_PAIRS} pairs: topic and "
    f"group {OTHER})"
)
seconds = st.one_of(st.sampled_from([float(b) for b in ACK_BUCKETS]), st.floats(0, 20_000, allow_nan=False))
pairs = st.sampled_from([("t", "g"), ("t", "h"), ("u", "g")])
# Each step: the acks of one Ack request on a topic, or (None) the group's state on the topic forgotten.
steps = st.lists(st.tuples(pairs, st.none() | st.lists(seconds, min_size=1, max_size=40)), max_size=12)


def exposition(registry: CollectorRegistry) -> list[str]:
    """The histogram's lines of a scrape, `_created` values left out (times)."""
    lines = generate_latest(registry).decode().splitlines()
    return [line.rsplit(" ", 1)[0] if "_created" in line else line for line in lines if NAME in line]


@pytest.mark.parametrize("created", [True, False])
@given(steps=steps)
def test_the_ack_latency_histogram_exports_what_a_prometheus_histogram_does(
    created: bool, steps: list[tuple[tuple[str, str], list[float] | None]]
) -> None:
    metrics = BrokerMetrics()
    reference = CollectorRegistry()
    histogram = Histogram(NAME, HELP, ["topic", "group"], buckets=ACK_BUCKETS, registry=reference)
    for pair, acked in steps:
        if acked is None:
            metrics.forget(*pair)
            if pair in {tuple(labels) for labels in histogram._metrics}:
                histogram.remove(*pair)
            continue
        metrics.acked(*pair, acked)
        for s in acked:
            histogram.labels(*pair).observe(s)
    with created_series(created):
        assert exposition(metrics.registry) == exposition(reference)


def test_a_forgotten_pair_gives_its_place_to_another() -> None:
    metrics = BrokerMetrics()
    for i in range(MAX_LATENCY_PAIRS):
        metrics.acked("t", f"g{i}", [1.0])
    metrics.forget("t", "g0")
    metrics.acked("t", "new", [2.0])
    metrics.acked("t", "newer", [3.0])
    count = f"{NAME}_count"
    assert metrics.registry.get_sample_value(count, {"topic": "t", "group": "g0"}) is None
    assert metrics.registry.get_sample_value(count, {"topic": "t", "group": "new"}) == 1
    assert metrics.registry.get_sample_value(f"{NAME}_sum", {"topic": OTHER, "group": OTHER}) == 3.0
