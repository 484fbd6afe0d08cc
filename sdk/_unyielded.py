"""The received batches an iteration has not yielded yet: each message is yielded once or given back once."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from ._at_work import AtWork
from ._forks import restarted_after_fork
from .message import Message


class Unyielded:
    """The messages of received batches that iterations have not yielded yet, one batch per iteration in progress.

    An iteration that ends early (``break``, an error in the loop's body, the consumer closed) gives back what
    is left of its batch instead of leaving it invisible for ``invisible`` seconds. Thread-safe: each message is
    taken once, either by its iteration (`next`) or to be given back (`end`, `take_all`, which `close()` uses).
    """

    def __init__(self) -> None:
        self._keys = itertools.count()
        self._restart()
        _live_unyielded.add(self)

    def _restart(self) -> None:
        """Nothing held. A forked child starts so: the batches are its parent's iterations', which the parent
        yields or gives back itself (the child's close() giving them back would fail the parent's acks) —
        tests/unit/sdk/test_fork.py::test_a_forked_childs_close_gives_back_nothing_its_parent_holds."""
        self._batches: dict[int, deque[Message]] = {}
        self._lock = threading.RLock()  # a signal handler's close() may take it on a thread holding it
        self._giving_back = AtWork(self._lock)  # a token of each `ended` block under way

    def start(self, messages: Iterable[Message]) -> int:
        """Hold a batch an iteration received; the key to its other calls."""
        key = next(self._keys)
        with self._lock:
            self._batches[key] = deque(messages)
        return key

    def next(self, key: int) -> Message | None:
        """The batch's next message to yield; None when none is left (or `take_all` took them)."""
        with self._lock:
            batch = self._batches.get(key)
            return batch.popleft() if batch else None

    def end(self, key: int) -> list[Message]:
        """The iteration is done with its batch: the messages it did not yield (to give back)."""
        with self._lock:
            return list(self._batches.pop(key, ()))

    @contextlib.contextmanager
    def ended(self, key: int) -> Iterator[list[Message]]:
        """`end`, for an iteration that gives the messages back inside the block, which `wait_given_back` waits for:
        a message is either taken here or by `take_all`, and a close() that found it taken here keeps the channel
        open for its give-back — tests/unit/sdk/test_give_back.py::
        test_close_waits_for_the_give_back_an_iteration_took_its_batch_for. Its token goes whatever interrupts
        it (a signal's exception) — tests/unit/sdk/test_close_interleavings.py::
        test_a_ctrl_c_in_an_iterations_give_back_leaves_close_nothing_to_wait_for."""
        token = object()
        try:
            yield self._end_under(token, key)
        finally:
            self._giving_back.end(token)

    def _end_under(self, token: object, key: int) -> list[Message]:
        """`end`, the block's token kept with the batch's messages it took (none: no token), in one step."""
        with self._lock:
            rest = self.end(key)
            if rest:
                self._giving_back.begin(token)
            return rest

    def wait_given_back(self, timeout: float) -> bool:
        """Whether the `ended` blocks of other threads under way ended within `timeout` (a close() in a signal
        handler does not wait for its own thread's: see `after_mine`)."""
        return self._giving_back.wait_others(timeout)

    def after_mine(self, then: Callable[[], None]) -> bool:
        """Whether this thread is in an `ended` block (a close() in a signal handler of an iteration giving back its
        batch); if so, `then` runs once its blocks have ended — tests/unit/sdk/test_close_interleavings.py::
        test_close_in_a_signal_handler_during_the_iterations_give_back_lets_it_finish."""
        return self._giving_back.after_mine(then)

    def take_all(self) -> list[Message]:
        """Every held message of every iteration (the consumer closes: to give back); their iterations get no more."""
        with self._lock:
            out = [message for batch in self._batches.values() for message in batch]
            for batch in self._batches.values():
                batch.clear()
        return out


_live_unyielded = restarted_after_fork(Unyielded._restart)
