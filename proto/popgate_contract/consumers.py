"""Live consumers as the brokers list them, merged the way the proxy's admin service and `popgate group consumers`
show them."""

from __future__ import annotations

from collections.abc import Iterable

from popgate_pb import broker_pb2 as bpb


def latest_consumers(listed: Iterable[bpb.Consumer]) -> list[bpb.Consumer]:
    """One row per client of each group, its latest sighting over every broker's list and every proxy's report: a
    client that moved to another proxy (a reconnect, a connection's age) is one consumer, shown via the proxy that
    saw it last — test_admin_fanout.py::test_a_client_seen_by_two_proxies_is_one_consumer."""
    latest: dict[tuple[str, str], bpb.Consumer] = {}
    for consumer in listed:
        key = (consumer.group, consumer.client_id)
        if key not in latest or latest[key].last_seen_ms < consumer.last_seen_ms:
            latest[key] = consumer
    return [latest[key] for key in sorted(latest)]
