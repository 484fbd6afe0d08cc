"""The queue log's filtered counts and searches against the plain linear scans they replace.

The log answers from per-block tag summaries; these properties check it gives exactly what a scan of
every tag gives, over queues that start past offset 0, span several blocks, grow between queries, and
have blocks with too many distinct tags to summarise.
"""

from __future__ import annotations

import tracemalloc

from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.filters import MATCH_ALL, TagFilter
from broker.inflight import GroupQueue
from broker.lag import queue_lag
from broker.log import BLOCK, MAX_BLOCK_TAGS, PayloadCache, QueueLog
from broker.store import QueueIndex, Record

# The oracles: the linear versions the log used before it kept block summaries.


def linear_count(tags: list[str | None], min_offset: int, start: int, end: int, f: TagFilter) -> int:
    start = max(start, min_offset)
    end = min(end, min_offset + len(tags))
    return sum(1 for t in tags[start - min_offset : end - min_offset] if f.matches(t)) if end > start else 0


def linear_first(tags: list[str | None], min_offset: int, start: int, f: TagFilter) -> int:
    start = max(start, min_offset)
    if f.tags is None:  # matches every message
        return min(start, min_offset + len(tags))
    for i in range(start - min_offset, len(tags)):
        if f.matches(tags[i]):
            return min_offset + i
    return min_offset + len(tags)


def linear_matching(tags: list[str | None], min_offset: int, start: int, f: TagFilter, limit: int) -> list[int]:
    out: list[int] = []
    for offset in range(max(start, min_offset), min_offset + len(tags)):
        if len(out) >= limit:
            break
        if f.matches(tags[offset - min_offset]):
            out.append(offset)
    return out


# A queue is built from runs: ("a", 700) is 700 messages tagged "a"; (DISTINCT, n) is n messages with
# up to 90 different tags, more than a block summary holds.
DISTINCT = "<distinct>"
FEW_TAGS = ["a", "b", "c", None]
Run = tuple[str | None, int]
runs = st.lists(st.tuples(st.sampled_from([*FEW_TAGS, DISTINCT]), st.integers(1, 1500)), max_size=8)
filters = st.one_of(
    st.just(MATCH_ALL),
    st.frozensets(st.sampled_from(["a", "b", "c", "u1", "u7", "u89", "zz"]), min_size=1, max_size=3).map(TagFilter),
)


def expand(run_list: list[Run]) -> list[str | None]:
    tags: list[str | None] = []
    for tag, n in run_list:
        tags += [f"u{i % 90}" for i in range(n)] if tag == DISTINCT else [tag] * n
    return tags


def build(min_offset: int, loaded: list[str | None], appended: list[str | None]) -> QueueLog:
    """A log rebuilt from a stored index (as at start), then appended to (as on send)."""
    q = QueueLog("t", 0, QueueIndex(min_offset, [1000 + min_offset + i for i in range(len(loaded))], list(loaded)))
    for tag in appended:
        q.append(Record("t", 0, q.max_offset, 1000 + q.max_offset, tag, b""))
    return q


def probes(min_offset: int, size: int) -> list[int]:
    """Offsets around the ends, the block boundaries and a few in between."""
    end = min_offset + size
    points = {min_offset - 5, min_offset, min_offset + 1, end - 1, end, end + 3, (min_offset + end) // 2}
    first_block = min_offset // BLOCK * BLOCK
    for b in range(first_block, end + BLOCK, BLOCK):
        points |= {b - 1, b, b + 1}
    return sorted(points)


@settings(deadline=None)
@given(
    min_offset=st.integers(0, 3 * BLOCK),
    loaded=runs,
    appended=runs,
    f=filters,
    extra=st.lists(st.integers(-10, 2 * 8 * 1500 + 10), max_size=8),  # relative to min_offset
)
@example(min_offset=0, loaded=[(DISTINCT, 3 * BLOCK)], appended=[("a", 5)], f=TagFilter(frozenset({"u7"})), extra=[])
@example(min_offset=BLOCK - 1, loaded=[("b", 1)], appended=[("a", 2 * BLOCK)], f=TagFilter(frozenset({"a"})), extra=[])
def test_counts_and_searches_equal_linear_scans(
    min_offset: int, loaded: list[Run], appended: list[Run], f: TagFilter, extra: list[int]
) -> None:
    loaded_tags, appended_tags = expand(loaded), expand(appended)
    tags = loaded_tags + appended_tags
    q = build(min_offset, loaded_tags, appended_tags)
    points = probes(min_offset, len(tags))
    for start in points + [min_offset + e for e in extra]:
        assert q.first_match(start, f) == linear_first(tags, min_offset, start, f)
        for limit in (0, 1, 3, 50):
            assert list(q.matching(start, f, limit)) == linear_matching(tags, min_offset, start, f, limit)
        for end in (points[1], points[-3], q.max_offset - 1, start + 2):  # an end before the queue's
            assert q.first_match(start, f, end) == min(linear_first(tags, min_offset, start, f), end, q.max_offset)
            within = [o for o in linear_matching(tags, min_offset, start, f, 10**6) if o < end]
            assert list(q.matching(start, f, 3, end)) == within[:3]
    # Ranges with both ends at and around block boundaries (the first ones, the last ones) and anywhere.
    ends = points[:5] + points[-5:] + [min_offset + e for e in extra]
    for start, end in [(s, e) for s in points for e in (min_offset, q.max_offset)] + [
        (s, e) for s in ends for e in ends
    ]:
        assert q.count_matching(start, end, f) == linear_count(tags, min_offset, start, end, f)


@settings(deadline=None)
@given(min_offset=st.integers(0, 3 * BLOCK), loaded=runs, appended=runs, extra=st.lists(st.integers(-10, 13000)))
def test_tags_between_holds_every_tag_of_the_range(
    min_offset: int, loaded: list[Run], appended: list[Run], extra: list[int]
) -> None:
    """The sweep answers a filter none of whose tags `tags_between` lists without searching: it must never
    leave out a tag that is in the range (None, when it cannot say, is always allowed)."""
    loaded_tags, appended_tags = expand(loaded), expand(appended)
    tags = loaded_tags + appended_tags
    q = build(min_offset, loaded_tags, appended_tags)
    points = probes(min_offset, len(tags)) + [min_offset + e for e in extra]
    for start in points:
        for end in points:
            present = q.tags_between(start, end, max_blocks=64)
            inside = set(tags[max(start, min_offset) - min_offset : max(0, min(end, q.max_offset) - min_offset)])
            if present is None:
                lo, hi = max(start, min_offset), min(end, q.max_offset)
                assert lo < hi  # an empty range is always answerable
            else:
                assert inside <= present, (start, end)
    assert build(0, ["a"] * 5, []).tags_between(0, 5, max_blocks=64) == {"a"}  # a summary, not None


@settings(deadline=None)
@given(
    min_offset=st.integers(0, 2 * BLOCK),
    loaded=runs,
    f=filters,
    pull=st.integers(0, 3 * BLOCK),
    grow=runs,
    steps=st.lists(st.integers(-BLOCK, 2 * BLOCK), max_size=8),
    other=filters,
)
def test_lag_equals_linear_scans_while_the_queue_grows(
    min_offset: int, loaded: list[Run], f: TagFilter, pull: int, grow: list[Run], steps: list[int], other: TagFilter
) -> None:
    """Also while the group consumes (its pull offset moves, also back: a state restored from the store) and its
    filter changes: lag counts only what changed since the last count, which must not drift."""
    tags = expand(loaded)
    q = build(min_offset, tags, [])
    state = GroupQueue(0, pull)
    for i, new in enumerate([[], *(expand([run]) for run in grow)]):
        for tag in new:
            q.append(Record("t", 0, q.max_offset, 1000 + q.max_offset, tag, b""))
        tags += new
        if steps:
            pull = state.pull_offset = max(0, pull + steps[i % len(steps)])
        if i % 3 == 2:
            queue_lag(q, state, other, 0)  # the group's filter changed in between
        lag = queue_lag(q, state, f, 0)
        start = max(pull, min_offset)
        assert lag.ready == linear_count(tags, min_offset, start, q.max_offset, f)
        oldest = linear_first(tags, min_offset, start, f)
        assert lag.oldest_unacked_store_ms == (1000 + oldest if oldest < q.max_offset else 0)


def test_sparse_tag_deep_in_a_long_backlog_is_found_and_counted() -> None:
    n = 50 * BLOCK
    q = build(0, ["x"] * (n - 3), ["rare", "x", "rare"])
    rare = TagFilter.parse("rare")
    assert q.first_match(1, rare) == n - 3
    assert list(q.matching(0, rare, 10)) == [n - 3, n - 1]
    assert q.count_matching(0, n, rare) == 2
    assert q.count_matching(0, n, TagFilter.parse("x || rare")) == n
    assert q.count_matching(5, n - 1, MATCH_ALL) == n - 6


def test_blocks_with_many_distinct_tags_are_still_counted_exactly() -> None:
    tags: list[str | None] = [f"id-{i}" for i in range(3 * BLOCK)]
    assert len(set(tags[:BLOCK])) > MAX_BLOCK_TAGS
    q = build(0, tags[:BLOCK], tags[BLOCK:])
    wanted = TagFilter.parse("id-5 || id-2000 || id-9999")
    assert q.count_matching(0, q.max_offset, wanted) == 2
    assert q.first_match(6, wanted) == 2000


@settings(deadline=None)
@given(
    min_offset=st.integers(0, 3 * BLOCK),
    loaded=runs,
    appended=runs,
    cut=st.integers(1, 8 * 1500),
    f=filters,
    fifo=st.lists(st.integers(0, 8 * 1500), max_size=5),
)
@example(min_offset=0, loaded=[(DISTINCT, 3 * BLOCK)], appended=[], cut=BLOCK + 7, f=MATCH_ALL, fifo=[])
def test_a_trimmed_log_is_the_log_a_start_loads_from_what_stays(
    min_offset: int, loaded: list[Run], appended: list[Run], cut: int, f: TagFilter, fifo: list[int]
) -> None:
    """Retention trims the index (`QueueLog.trim`): store times, tags, FIFO marks and block summaries are then
    the ones a broker loads from the trimmed store, and counts and searches still equal linear scans."""
    tags = expand(loaded) + expand(appended)
    if len(tags) < 2:
        return
    new_min = min_offset + min(cut, len(tags) - 1)  # never the whole queue (its last row stays)
    index = QueueIndex(min_offset, [1000 + min_offset + i for i in range(len(tags))], list(tags))
    index.fifo = sorted({min_offset + i for i in fifo if i < len(tags)})
    q = QueueLog("t", 0, index)
    q.trim(new_min)
    kept = tags[new_min - min_offset :]
    fresh = QueueLog(
        "t",
        0,
        QueueIndex(
            new_min,
            [1000 + new_min + i for i in range(len(kept))],
            list(kept),
            [o for o in index.fifo if o >= new_min],
        ),
    )
    assert (q.min_offset, q.max_offset, list(q.store_ms), q.tags) == (
        fresh.min_offset,
        fresh.max_offset,
        list(fresh.store_ms),
        fresh.tags,
    )
    assert q.fifo == fresh.fifo and q._blocks == fresh._blocks  # noqa: SLF001 - white-box: the summaries
    for start in probes(new_min, len(kept)):
        assert q.first_match(start, f) == linear_first(kept, new_min, start, f)
        assert q.count_matching(start, q.max_offset, f) == linear_count(kept, new_min, start, q.max_offset, f)


def test_stored_before_finds_the_first_newer_message_also_when_the_clock_went_back() -> None:
    q = QueueLog("t", 0, QueueIndex(10, [100, 200, 300, 400, 500], [None] * 5))
    assert q.stored_before(300, 15) == 12  # offsets 10, 11 are older than 300
    assert q.stored_before(50, 15) == 10
    assert q.stored_before(1000, 15) == 15
    assert q.stored_before(1000, 13) == 13  # looks no further than asked
    back = QueueLog("t", 0, QueueIndex(0, [100, 900, 200, 300, 400], [None] * 5))  # the clock set back at 2
    assert back.stored_before(350, 5) == 1  # 900 is newer: what follows it is kept too


def test_the_payload_cache_holds_about_its_bound_in_memory() -> None:
    """What a full cache holds (its payloads, their dicts' slots, its eviction order), as tracemalloc counts it, stays
    within 10 % of its byte bound for small payloads as for large ones, all through its evictions."""
    bound = 512 << 10
    for size in (16, 100, 1_000):
        queues = [QueueLog("t", q) for q in range(8)]
        tracemalloc.start()
        cache = PayloadCache(bound)
        held: list[float] = []
        adds = 3 * bound // size
        for i in range(adds):
            cache.add(queues[i % 8], i // 8, bytes(size - 1) + bytes([i % 251]))
            if i > adds // 2 and i % 499 == 0:
                held.append(tracemalloc.get_traced_memory()[0] / bound)
        tracemalloc.stop()
        assert 0.7 < min(held) and max(held) < 1.1, size
