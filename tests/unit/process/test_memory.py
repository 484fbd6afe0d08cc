"""When a process gives freed heap memory back (popgate_process.memory): decided from samples of its resident size."""

from __future__ import annotations

import gc
import weakref

from popgate_process.memory import MemoryTrimmer, TrimPolicy

MiB = 1024 * 1024


def test_a_burst_is_trimmed_once_over_the_size_at_rest_and_again_after_it() -> None:
    policy = TrimPolicy(grow_bytes=64 * MiB, spacing_s=15)
    assert not policy.due(45 * MiB, 0)  # at rest: the floor
    assert not policy.due(100 * MiB, 5)  # under floor + 64 MiB
    assert policy.due(290 * MiB, 10)  # the burst
    policy.trimmed(290 * MiB, 175 * MiB, 10)  # part of it was still in use
    assert not policy.due(200 * MiB, 15)  # not twice within 15 s
    assert policy.due(200 * MiB, 25)  # the burst is over: what it left is given back
    policy.trimmed(200 * MiB, 55 * MiB, 25)
    assert not policy.due(60 * MiB, 45)


def test_memory_in_use_is_not_trimmed_again_until_it_grows_by_as_much_again() -> None:
    policy = TrimPolicy(grow_bytes=64 * MiB, spacing_s=15)
    policy.due(45 * MiB, 0)
    assert policy.due(300 * MiB, 5)  # e.g. 10,000 held receives
    policy.trimmed(300 * MiB, 296 * MiB, 5)  # little to give back: it is in use
    assert not policy.due(300 * MiB, 30) and not policy.due(340 * MiB, 60)
    assert policy.due(360 * MiB, 30)


def test_a_burst_whose_memory_stayed_in_use_a_while_is_given_back_once_it_is_over() -> None:
    """Trims during the burst gave back little; after it the memory is free: tried again `retry_s` later (it was
    held until the size grew by 64 MiB more, which never came: 231 MiB kept where a trim gave back 179)."""
    policy = TrimPolicy(grow_bytes=64 * MiB, spacing_s=15, retry_s=60)
    policy.due(45 * MiB, 0)
    assert policy.due(150 * MiB, 5)
    policy.trimmed(150 * MiB, 150 * MiB, 5)  # mid-burst: in use
    assert policy.due(232 * MiB, 20)  # grew by 64 MiB more
    policy.trimmed(232 * MiB, 231 * MiB, 20)  # the burst ends right after
    assert not any(policy.due(231 * MiB, t) for t in range(25, 80, 5))  # held: the memory may still be in use
    assert policy.due(231 * MiB, 80)  # a minute later: tried again


def test_memory_in_use_for_good_is_tried_again_ever_more_seldom() -> None:
    """State that grew for good (10,000 groups, 100,000 in flight) keeps the size over the floor: each trim gives
    back little, and the next is tried after twice the wait of the one before, up to `max_retry_s`, not every
    `retry_s` for good (each trim's full collection stops the event loop)."""
    policy = TrimPolicy(grow_bytes=64 * MiB, spacing_s=15, retry_s=60, max_retry_s=600)
    policy.due(45 * MiB, 0)
    trims = []
    for t in range(5, 3000, 5):
        if policy.due(400 * MiB, t):
            trims.append(t)
            policy.trimmed(400 * MiB, 399 * MiB, t)
    assert trims[:5] == [5, 65, 185, 425, 905]  # waits of 60, 120, 240, 480 s
    assert all(b - a == 600 for a, b in zip(trims[5:], trims[6:], strict=False))  # then every max_retry_s
    policy.trimmed(500 * MiB, 100 * MiB, 3000)  # one that gave back much: the wait starts over
    assert policy.due(400 * MiB, 3000 + 60)


def test_a_steady_process_never_trims() -> None:
    policy = TrimPolicy(grow_bytes=64 * MiB, spacing_s=15)
    assert not any(policy.due(size * MiB, t * 5) for t, size in enumerate([50, 70, 60, 90, 80, 100, 95]))


class AlwaysDue(TrimPolicy):
    def due(self, resident: int, now_s: float) -> bool:
        return True


class Held:
    """An object a garbage cycle keeps (a burst's request caught in one)."""

    cycle: object


def test_a_trim_frees_garbage_cycles_first() -> None:
    # The broker and the proxy run the cyclic collector seldom (popgate_process.collector): memory a cycle holds
    # would not be free for malloc_trim until it ran.
    trimmer = MemoryTrimmer(policy=AlwaysDue())
    freed_before_trim: list[bool] = []
    held = Held()
    held.cycle = held
    gone = weakref.ref(held)
    del held
    trimmer._trim = lambda pad: freed_before_trim.append(gone() is None) or 1
    gc.disable()
    try:
        assert gone() is not None  # only the collector frees it
        trimmer.trim_if_due()
    finally:
        gc.enable()
    assert freed_before_trim == [True]
