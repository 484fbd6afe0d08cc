from broker.filters import MATCH_ALL, TagFilter
from broker.inflight import Delivery, GroupTopic, tokens
from broker.lag import queue_lag
from broker.log import ENTRY_BYTES, PayloadCache, QueueLog
from broker.store import Record


def make_queue(tags: list[str | None], store_ms: int = 1000) -> QueueLog:
    q = QueueLog("t", 0)
    for i, tag in enumerate(tags):
        q.append(Record("t", 0, i, store_ms + i, tag, b"p"))
    return q


def test_consumer_offset_is_lowest_inflight_else_pull() -> None:
    state = GroupTopic("g", "t")
    gq = state.queue(0, 0)
    gq.pull_offset = 5
    assert gq.consumer_offset == 5
    state.deliver(0, 2, Delivery(1, 7, 100))
    state.deliver(0, 4, Delivery(1, 8, 50))
    assert gq.consumer_offset == 2
    state.remove(0, 2)
    assert gq.consumer_offset == 4


def test_expiry_order_and_stale_entries_are_skipped() -> None:
    state = GroupTopic("g", "t")
    state.queue(0, 0).pull_offset = 3
    state.deliver(0, 0, Delivery(1, 1, 300))
    state.deliver(0, 1, Delivery(1, 2, 100))
    state.deliver(0, 2, Delivery(1, 3, 200))
    state.remove(0, 1)  # acked: its heap entry is stale
    state.deliver(0, 2, Delivery(1, 4, 900))  # invisibility changed: old entry stale
    assert state.next_deadline() == 300
    assert state.take_expired(299, 10) == []
    expired = state.take_expired(1000, 10)
    assert [(q, o, d.token) for q, o, d in expired] == [(0, 0, 1), (0, 2, 4)]
    assert state.next_deadline() is None


def test_current_checks_the_token() -> None:
    state = GroupTopic("g", "t")
    state.queue(0, 0).pull_offset = 1
    state.deliver(0, 0, Delivery(1, 42, 100))
    assert state.current(0, 0, 42) is not None
    assert state.current(0, 0, 41) is None
    assert state.current(1, 0, 42) is None


def test_heap_compacts_when_stale_entries_dominate() -> None:
    state = GroupTopic("g", "t")
    state.queue(0, 0).pull_offset = 5000
    for i in range(5000):
        state.deliver(0, i, Delivery(1, i, 10**6 + i))
        state.remove(0, i)
    assert len(state._heap) < 2000  # noqa: SLF001 - white-box check of the bound


def test_lag_without_filter() -> None:
    q = make_queue([None] * 10)
    state = GroupTopic("g", "t")
    gq = state.queue(0, 0)
    gq.pull_offset = 6
    state.deliver(0, 3, Delivery(1, 1, 0))
    state.deliver(0, 5, Delivery(1, 2, 0))
    lag = queue_lag(q, gq, MATCH_ALL, 0)
    assert (lag.max_offset, lag.consumer_offset, lag.pull_offset) == (10, 3, 6)
    assert (lag.ready, lag.inflight, lag.lag) == (4, 2, 6)
    assert lag.oldest_unacked_store_ms == 1003
    assert lag.lag_seconds(2003) == 1.0


def test_lag_with_filter_counts_only_matching_messages() -> None:
    q = make_queue(["a", "b", None, "a", "c", "a"])
    f = TagFilter.parse("a || c")
    lag = queue_lag(q, None, f, 0)
    assert (lag.ready, lag.inflight, lag.lag) == (4, 0, 4)
    assert lag.oldest_unacked_store_ms == 1000
    state = GroupTopic("g", "t", f)
    gq = state.queue(0, 0)
    gq.pull_offset = 4
    lag = queue_lag(q, gq, f, 0)
    assert (lag.ready, lag.lag) == (2, 2)
    assert lag.oldest_unacked_store_ms == 1004


def test_new_group_on_empty_queue_has_no_lag() -> None:
    lag = queue_lag(QueueLog("t", 0), None, MATCH_ALL, 0)
    assert (lag.lag, lag.oldest_unacked_store_ms, lag.lag_seconds(5)) == (0, 0, 0.0)


def test_matching_scans_from_start() -> None:
    q = make_queue(["a", "b", "a", "b", "a"])
    assert list(q.matching(1, TagFilter.parse("a"), 5)) == [2, 4]
    assert list(q.matching(0, MATCH_ALL, 2)) == [0, 1]
    assert q.first_match(3, TagFilter.parse("z")) == 5


def test_payload_cache_evicts_oldest_by_bytes() -> None:
    cache = PayloadCache(max_bytes=3 * (100 + ENTRY_BYTES))
    q = QueueLog("t", 0)
    for i in range(5):
        cache.add(q, i, b"x" * 100)
    assert sorted(q.payloads) == [2, 3, 4]
    assert cache.bytes <= cache.max_bytes


def test_compacting_the_deadline_heap_does_not_expire_a_delivery_twice() -> None:
    state = GroupTopic("g", "t")
    state.queue(0, 0).pull_offset = 3000
    state.deliver(0, 0, Delivery(1, 1, 100))  # expires, waits in `ready` to be popped again
    [(queue_id, offset, _)] = state.take_expired(150, 10)
    assert (queue_id, offset) == (0, 0)
    for offset in range(1, 2500):  # acked traffic: stale heap entries pile up until a compaction
        state.deliver(0, offset, Delivery(1, offset + 1, 10_000))
        state.remove(0, offset)
    assert state.take_expired(200, 10) == []  # offset 0 was taken once already


def test_tokens_are_48_random_bits_that_do_not_repeat() -> None:
    drawn = [tokens.getrandbits(48) for _ in range(5000)]  # across several refills of the buffer
    assert all(0 <= t < 1 << 48 for t in drawn) and len(set(drawn)) == len(drawn)
    assert max(drawn).bit_length() > 40  # the high bits are drawn too
