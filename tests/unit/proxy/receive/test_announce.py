"""GroupsSeen: which (topic, group) pairs a proxy has announced to the brokers, bounded."""

from __future__ import annotations

import pytest

from proxy.receive.announce import GroupsSeen


def test_a_pair_is_new_once() -> None:
    seen = GroupsSeen()
    assert seen.first_sight("t", "g")
    assert not seen.first_sight("t", "g")
    assert seen.first_sight("t", "other") and seen.first_sight("u", "g")


def test_the_least_recently_seen_pair_is_forgotten_past_the_capacity() -> None:
    seen = GroupsSeen(capacity=2)
    seen.first_sight("t", "a")
    seen.first_sight("t", "b")
    assert not seen.first_sight("t", "a")  # seen again: now the most recent
    assert seen.first_sight("t", "c")  # forgets b, the least recent
    assert len(seen) == 2
    assert not seen.first_sight("t", "a") and seen.first_sight("t", "b")


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        GroupsSeen(capacity=0)
