"""The proxy's book of live consumers (proxy.consumers): seen within the live time, gone at termination, bounded,
and a change noticed so that the report goes out within a second."""

from __future__ import annotations

from proxy.consumers import ConsumerBook

HOUR_MS = 3_600_000


def test_consumers_are_live_while_seen_and_gone_at_termination() -> None:
    now = [1.0]  # the book's monotonic clock (s); wall times below are 1,000 times it, as if no step came
    book = ConsumerBook(live_s=10, max_consumers=3, monotonic=lambda: now[0])
    book.seen("c1", "g", 1_000)
    now[0] = 2.0
    book.seen("c2", "g", 2_000)
    now[0] = 3.0
    book.seen("c1", "h", 3_000)
    book.seen("", "g", 3_000)  # no client id: nobody to name
    assert book.changed
    now[0] = 5.0
    assert [(c.group, c.client_id, c.last_seen_ms) for c in book.live()] == [
        ("g", "c1", 1_000),
        ("g", "c2", 2_000),
        ("h", "c1", 3_000),
    ]
    now[0] = 11.5
    assert [c.client_id for c in book.live()] == ["c2", "c1"]  # c1 in g not seen for 10 s
    book.changed = False
    now[0] = 11.6
    book.seen("c2", "g", 11_600)  # seen again: nothing new to report at once
    assert not book.changed
    book.gone("c1")
    now[0] = 11.7
    assert book.changed and [c.client_id for c in book.live()] == ["c2"]
    for i in range(5):
        book.seen(f"n{i}", "g", 12_000 + i)
    assert [c.client_id for c in book.live()] == ["n2", "n3", "n4"]  # the oldest seen dropped first


def test_a_consumer_not_seen_for_the_live_time_is_gone_whatever_step_the_wall_clock_took() -> None:
    """Liveness is measured on the monotonic clock; the wall time a consumer was last seen is only shown."""
    now = [100.0]
    book = ConsumerBook(live_s=30, monotonic=lambda: now[0])
    book.seen("gone", "g", 1_800_000_000_000)  # its last heartbeat; it dies without a termination
    now[0] += 1
    book.seen("alive", "g", 1_800_000_001_000 - HOUR_MS)  # the wall clock stepped back an hour meanwhile
    now[0] += 30
    assert [(c.client_id, c.last_seen_ms) for c in book.live()] == [("alive", 1_800_000_001_000 - HOUR_MS)]
