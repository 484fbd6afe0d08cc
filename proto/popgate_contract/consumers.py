"""Live consumers as the brokers list them, merged the way the proxy's admin service and `popgate group consumers`
show them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from popgate_pb import broker_pb2 as bpb

# The most consumers a listing of every group answers (the first by group, then client id), saying when there were
# more: a broker's and a proxy's work for it stays bounded whatever the reports hold —
# tests/unit/broker/test_consumers.py::test_the_every_group_listing_is_bounded_and_says_it_was_cut.
EVERY_GROUP_LIMIT = 1_000

# The (group, topic) pairs a broker remembers having looked at a topic before it existed, the least recently looked
# forgotten first (broker.groups); a proxy announces at most this many pairs to a broker that comes up, the most
# recent last, so that those are the ones it keeps (proxy.receive.announce) — tests/unit/proxy/receive/
# test_announce.py::test_a_broker_that_comes_up_is_told_the_most_recent_pairs_it_keeps_oldest_first.
MAX_EARLY_LOOKS = 10_000


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


def first_consumers(answers: Sequence[bpb.ListConsumersResponse], limit: int) -> tuple[list[bpb.Consumer], bool]:
    """The brokers' answers merged as latest_consumers does, at most `limit`, and whether more are live. A broker
    that cut its answer may have left out any client past its last one: none of those is listed —
    test_admin_fanout.py::test_the_every_group_listing_through_the_proxy_is_bounded_and_says_it_was_cut."""
    rows = latest_consumers(c for a in answers for c in a.consumers)
    stops = [(a.consumers[-1].group, a.consumers[-1].client_id) for a in answers if a.cut and a.consumers]
    if stops:
        rows = [c for c in rows if (c.group, c.client_id) < min(stops)]
    cut = any(a.cut for a in answers) or len(rows) > limit
    return rows[:limit], cut
