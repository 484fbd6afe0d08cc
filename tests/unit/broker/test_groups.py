"""The consumer-group registry without sockets or a store: where a group starts, which filter is stored, the
--max-groups bound, and groups that looked at a topic before it existed."""

from __future__ import annotations

import pytest

from broker import groups as groups_module
from broker.filters import MATCH_ALL, TagFilter
from broker.groups import ConsumerGroups
from broker.log import QueueLog, TopicLog
from broker.settings import BrokerSettings
from broker.store import Op, Record, SetGroupFilter, SetPullOffset
from popgate_contract.errors import TooManyRequests


def topic_with(name: str, messages: int, queues: int = 2) -> TopicLog:
    log = TopicLog(name, [QueueLog(name, q) for q in range(queues)])
    for offset in range(messages):
        for queue in log.queues:
            queue.append(Record(name, queue.queue_id, offset, 1_000 + offset, None, b"m"))
    return log


def test_first_look_under_latest_starts_after_the_last_message_and_stores_start_and_filter() -> None:
    topics = {"t": topic_with("t", 3)}
    registry = ConsumerGroups(BrokerSettings(consume_from="latest"), topics)
    ops: list[Op] = []
    state = registry.reader("g", "t", TagFilter.parse("a"), ops, pop_filter=False)
    assert state is not None and {q: gq.pull_offset for q, gq in state.queues.items()} == {0: 3, 1: 3}
    assert ops == [SetGroupFilter("g", "t", "a"), SetPullOffset("g", "t", 0, 3), SetPullOffset("g", "t", 1, 3)]
    ops = []
    registry.reader("g", "t", TagFilter.parse("b"), ops, pop_filter=False)  # a later Notification keeps it
    assert ops == [] and str(state.filter) == "a"
    registry.reader("g", "t", TagFilter.parse("b"), ops)  # a Pop sets it
    assert ops == [SetGroupFilter("g", "t", "b")]


def test_dead_letter_topics_start_at_their_first_message_also_under_latest() -> None:
    topics = {"%DLQ%g": topic_with("%DLQ%g", 2, queues=1)}
    registry = ConsumerGroups(BrokerSettings(consume_from="latest"), topics)
    state = registry.reader("resend", "%DLQ%g", MATCH_ALL, [])
    assert state is not None and state.queues[0].pull_offset == 0


def test_a_look_before_the_topic_exists_keeps_no_state_and_is_adopted_from_the_first_message() -> None:
    topics: dict[str, TopicLog] = {}
    registry = ConsumerGroups(BrokerSettings(consume_from="latest"), topics)
    assert registry.reader("g", "later", TagFilter.parse("a"), []) is None
    assert registry.groups == {}
    topics["later"] = topic_with("later", 2, queues=1)
    ops: list[Op] = []
    registry.adopt_early("later", ops)
    state = registry.groups[("g", "later")]
    assert state.queues[0].pull_offset == 0 and str(state.filter) == "a"
    assert ops == [SetGroupFilter("g", "later", "a"), SetPullOffset("g", "later", 0, 0)]
    ops = []
    registry.adopt_early("later", ops)  # adopted once
    assert ops == []


def test_early_looks_are_bounded_oldest_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groups_module, "MAX_EARLY_LOOKS", 2)
    topics: dict[str, TopicLog] = {}
    registry = ConsumerGroups(BrokerSettings(), topics)
    for topic in ("t1", "t2", "t3"):
        registry.reader("g", topic, MATCH_ALL, [])
    for topic in ("t1", "t2", "t3"):
        topics[topic] = topic_with(topic, 1, queues=1)
        registry.adopt_early(topic, [])
    assert sorted(registry.groups) == [("g", "t2"), ("g", "t3")]


def test_a_new_group_past_max_groups_is_refused_and_known_ones_go_on() -> None:
    topics = {"t": topic_with("t", 1)}
    registry = ConsumerGroups(BrokerSettings(max_groups=1), topics)
    registry.reader("g1", "t", MATCH_ALL, [])
    with pytest.raises(TooManyRequests, match="--max-groups"):
        registry.reader("g2", "t", MATCH_ALL, [])
    assert registry.reader("g1", "t", MATCH_ALL, []) is not None


def test_a_known_groups_later_look_moves_no_offset_also_under_latest() -> None:
    """A proxy announces its groups to a broker again whenever it comes up: only a first look fixes a start."""
    topics = {"t": topic_with("t", 3)}
    registry = ConsumerGroups(BrokerSettings(consume_from="latest"), topics)
    state = registry.reader("g", "t", MATCH_ALL, [], pop_filter=False)
    assert state is not None
    for queue in topics["t"].queues:
        queue.append(Record("t", queue.queue_id, 3, 2_000, None, b"after"))
    ops: list[Op] = []
    assert registry.reader("g", "t", TagFilter.parse("a"), ops, pop_filter=False) is state
    assert ops == [] and {q: gq.pull_offset for q, gq in state.queues.items()} == {0: 3, 1: 3}


def test_an_early_look_again_keeps_the_pair_and_the_least_recently_looked_is_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(groups_module, "MAX_EARLY_LOOKS", 2)
    topics: dict[str, TopicLog] = {}
    registry = ConsumerGroups(BrokerSettings(), topics)
    for topic in ("t1", "t2", "t1", "t3"):
        registry.reader("g", topic, MATCH_ALL, [])
    for topic in ("t1", "t2", "t3"):
        topics[topic] = topic_with(topic, 1, queues=1)
        registry.adopt_early(topic, [])
    assert sorted(registry.groups) == [("g", "t1"), ("g", "t3")]
