"""BatchHistogram (popgate_process.histogram): what a prometheus_client Histogram exports after the same updates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from popgate_process.histogram import BatchHistogram
from tests.unit.process.exposition import created_series, family_samples

NAME = "popgate_test_latency_seconds"
BUCKETS = (0.005, 0.01, 0.5, 1, 60, 3600)
amounts = st.one_of(st.sampled_from([float(b) for b in BUCKETS]), st.floats(-1, 5000, allow_nan=False))
pairs = st.sampled_from([("t", "g"), ("t", "h"), ("u", "g")])
# Each step: amounts observed at once for a pair, or (None) the pair's series removed.
steps = st.lists(st.tuples(pairs, st.none() | st.lists(amounts, max_size=40)), max_size=16)


@pytest.mark.parametrize("created", [True, False])
@given(steps=steps)
def test_a_batch_histogram_exports_what_a_prometheus_histogram_does(
    created: bool, steps: list[tuple[tuple[str, str], list[float] | None]]
) -> None:
    batched, reference = CollectorRegistry(), CollectorRegistry()
    histogram = BatchHistogram(NAME, "doc", ("topic", "group"), BUCKETS)
    batched.register(histogram)
    expected = Histogram(NAME, "doc", ["topic", "group"], buckets=BUCKETS, registry=reference)
    for pair, observed in steps:
        if observed is None:
            histogram.remove(pair)
            if pair in {tuple(labels) for labels in expected._metrics}:
                expected.remove(*pair)
            continue
        histogram.observe(pair, observed)
        child = expected.labels(*pair)
        for amount in observed:
            child.observe(amount)
    with created_series(created):
        assert family_samples(batched, NAME) == family_samples(reference, NAME)


def test_a_removed_series_starts_anew() -> None:
    registry = CollectorRegistry()
    histogram = BatchHistogram(NAME, "doc", ("topic",), BUCKETS)
    registry.register(histogram)
    histogram.observe(("t",), [1.0, 2.0])
    histogram.remove(("t",))
    histogram.remove(("never",))  # nothing to remove: no error
    assert registry.get_sample_value(f"{NAME}_count", {"topic": "t"}) is None
    histogram.observe(("t",), [0.5])
    assert registry.get_sample_value(f"{NAME}_count", {"topic": "t"}) == 1
    assert registry.get_sample_value(f"{NAME}_sum", {"topic": "t"}) == 0.5
