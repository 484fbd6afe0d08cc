"""Work under way, thread by thread: what a blocking close() waits for before its channel closes, and what it puts
its channel's close off behind when it runs in a signal handler of a thread doing such work."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class AtWork:
    """Entries of work under way (thread-safe), each with the thread doing it: other threads wait for them to end
    (`wait_others`), and a call of the thread doing some (a signal handler's close()) is put off until its own have
    ended (`after_mine`). `lock` is the owner's, when its own state changes with the entries."""

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self.changed = threading.Condition(lock if lock is not None else threading.RLock())
        self._work: dict[object, tuple[int, Any]] = {}  # key: the thread doing it, and what it is
        self._then: tuple[int, Callable[[], None]] | None = None  # to run once that thread's work has ended

    def begin(self, key: object, what: Any = None) -> None:
        with self.changed:
            self._work[key] = (threading.get_ident(), what)

    def end(self, key: object) -> None:
        """`key`'s work has ended (none began: nothing). Its entry goes first, in one step, so a signal's exception
        leaves no stale one."""
        if self._work.pop(key, None) is None:
            return
        here = threading.get_ident()
        with self.changed:
            self.changed.notify_all()
            then = self._then
            if then is None or then[0] != here or here in self._threads():
                return
            self._then = None
        then[1]()

    def what(self) -> list[Any]:
        """What is under way, from a copy (`end` takes an entry out without the lock)."""
        return [what for _, what in list(self._work.values())]

    def _threads(self) -> list[int]:
        return [thread for thread, _ in list(self._work.values())]

    def wait_others(self, timeout: float) -> bool:
        """Whether the work of other threads under way ended within `timeout` (not this thread's own: a close() in
        a signal handler of a thread at work, whose work waits for it)."""
        here = threading.get_ident()
        with self.changed:
            return self.changed.wait_for(lambda: all(thread == here for thread in self._threads()), timeout)

    def after_mine(self, then: Callable[[], None]) -> bool:
        """Whether this thread has work under way; if so, `then` runs once it has all ended."""
        here = threading.get_ident()
        with self.changed:
            if here not in self._threads():
                return False
            self._then = (here, then)
            return True
