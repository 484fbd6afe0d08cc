"""The broker's and the proxy's cyclic garbage collector: less often, never off."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from popgate_process.collector import YOUNG_THRESHOLD, collect_less_often


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_the_young_threshold_is_raised_the_older_ones_kept_and_start_up_frozen(collector: None) -> None:
    _, middle, old = gc.get_threshold()
    collect_less_often()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)
    assert gc.get_freeze_count() > 0


def test_a_garbage_cycle_is_still_collected_once_that_many_objects_were_made(collector: None) -> None:
    collect_less_often()
    gc.collect()
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    freed = []
    weakref.finalize(a, freed.append, "cycle")
    del a, b
    assert freed == []  # reference counting alone cannot free a cycle
    kept = [[] for _ in range(2 * YOUNG_THRESHOLD)]  # container objects made and kept: the young generation fills
    assert freed == ["cycle"]
    del kept
