"""The proxy's book of live consumers (proxy.consumers): seen within the live time, gone at termination, bounded,
and a change noticed so that the report goes out within a second."""

from __future__ import annotations

from proxy.consumers import ConsumerBook


def test_consumers_are_live_while_seen_and_gone_at_termination() -> None:
    book = ConsumerBook(live_s=10, max_consumers=3)
    book.seen("c1", "g", 1_000)
    book.seen("c2", "g", 2_000)
    book.seen("c1", "h", 3_000)
    book.seen("", "g", 3_000)  # no client id: nobody to name
    assert book.changed
    assert [(c.group, c.client_id, c.last_seen_ms) for c in book.live(5_000)] == [
        ("g", "c1", 1_000),
        ("g", "c2", 2_000),
        ("h", "c1", 3_000),
    ]
    assert [c.client_id for c in book.live(11_500)] == ["c2", "c1"]  # c1 in g not seen for 10 s
    book.changed = False
    book.seen("c2", "g", 11_600)  # seen again: nothing new to report at once
    assert not book.changed
    book.gone("c1")
    assert book.changed and [c.client_id for c in book.live(11_700)] == ["c2"]
    for i in range(5):
        book.seen(f"n{i}", "g", 12_000 + i)
    assert [c.client_id for c in book.live(12_010)] == ["n2", "n3", "n4"]  # the oldest seen dropped first
