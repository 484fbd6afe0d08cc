"""What a forked child must make anew: objects holding locks, threads or counters of the parent's."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def restarted_after_fork(restart: Callable[[T], None]) -> weakref.WeakSet[T]:
    """The live objects (add each as it is made) that a forked child calls `restart` on, in the child only —
    tests/unit/sdk/test_fork.py::test_a_forked_childs_unwaited_acks_are_sent and
    test_wire.py::test_forked_workers_do_not_repeat_each_others_message_ids."""
    live: weakref.WeakSet[T] = weakref.WeakSet()

    def after_in_child() -> None:
        for obj in list(live):
            restart(obj)

    if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
        os.register_at_fork(after_in_child=after_in_child)
    return live
