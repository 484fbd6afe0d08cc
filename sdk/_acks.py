"""Acks the application does not wait for (`ack` / `ack_many` with ``wait=False``, docs/SDK.md "Consume"): sent in
the background, at most MAX_UNWAITED_ACKS ack calls per consumer (one more waits for one of them to end), each
failure logged at WARNING (nobody else hears of it: that message comes again after its invisible time). Closing
the consumer refuses new ones and waits for those under way, at most CLOSE_WAIT_S, before the connection closes,
so their retries still run; what is left then is cancelled and counted in a WARNING —
tests/unit/sdk/test_ack_nowait.py. A blocking consumer's ack for which the OS refuses a thread raises a retriable
Unavailable and holds no slot —
tests/unit/sdk/test_ack_nowait.py::test_an_ack_the_os_refuses_a_thread_for_raises_unavailable_and_leaks_nothing.
`AsyncAcks` serves the asyncio consumer (a task each), `ThreadAcks` the blocking
one (a pool of threads, each sending one at a time)."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence

from . import _resend, errors
from ._forks import restarted_after_fork

MAX_UNWAITED_ACKS = 64
CLOSE_WAIT_S = 10.0
THREAD_IDLE_S = 30.0  # a ThreadAcks thread without work this long ends

Failures = list[tuple[str, errors.PopgateError]]
_Queued = tuple[concurrent.futures.Future[None], Callable[[], Failures], int]  # an ack queued for the thread


def _closed() -> errors.Unavailable:
    return _resend.client_closed()


def _no_thread(exc: RuntimeError) -> errors.Unavailable:
    return errors.Unavailable(
        f"no thread to ack without waiting ({exc}: out of processes or memory?): not acked, the message comes "
        "again after its invisible time; ack it again later, or with wait=True",
        retriable=True,
    )


def _log_failures(log: logging.Logger, failures: Sequence[tuple[str, errors.PopgateError]], total: int) -> None:
    if failures:
        message_id, error = failures[0]
        unknown = sum(isinstance(e, errors.Timeout) for _, e in failures)  # outcome unknown (errors.AckError)
        log.warning(
            "%d of %d message(s) acked without waiting were not acked (delivered again after their invisible time), "
            "%d of them not known to be acked (maybe acked: then never delivered again); first: %s: %s",
            len(failures),
            total,
            unknown,
            message_id,
            error,
        )


def _log_left(log: logging.Logger, left: int) -> None:
    if left:
        log.warning(
            "%d ack call(s) not waited for were still under way after %g s of close() (or of the end of the event "
            "loop): cancelled, their messages come again after their invisible time",
            left,
            CLOSE_WAIT_S,
        )


class AsyncAcks:
    """The asyncio consumer's acks not waited for: a task each. One the loop cancels as it ends (asyncio.run
    returned with the consumer open) is sent again, as a re-send, in a task `loop_ended` waits for —
    tests/unit/sdk/test_ack_nowait.py::test_acks_cut_short_by_the_end_of_asyncio_run_are_sent_again_and_waited_for."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._tasks: set[asyncio.Future[None]] = set()
        self._resends: dict[asyncio.Future[None], Callable[[], Awaitable[Failures]]] = {}
        self._stopped = False

    async def start(
        self, send: Callable[[], Awaitable[Failures]], total: int, resend: Callable[[], Awaitable[Failures]]
    ) -> None:
        """Run `send` (the ack calls of `total` messages) in a task, `resend` (the same as re-sends) if the loop
        cancels it; returns once it is started, after one of those under way ended when MAX_UNWAITED_ACKS are.
        Unavailable once `stop` began."""
        if self._stopped:
            raise _closed()
        while len(self._tasks) >= MAX_UNWAITED_ACKS:
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
            if self._stopped:
                raise _closed()
        task = asyncio.ensure_future(self._logged(send, total))
        self._tasks.add(task)
        self._resends[task] = resend
        task.add_done_callback(functools.partial(self._ended, total=total))

    def _ended(self, task: asyncio.Future[None], total: int) -> None:
        self._tasks.discard(task)
        resend = self._resends.pop(task, None)
        if task.cancelled() and resend is not None:  # not by `stop` or `loop_ended`: by the loop's end
            again = asyncio.ensure_future(self._logged(resend, total))
            self._tasks.add(again)
            again.add_done_callback(self._tasks.discard)

    async def _logged(self, send: Callable[[], Awaitable[Failures]], total: int) -> None:
        try:
            failures = await send()
        except Exception:  # a bug, not a failed ack (those are answers): logged, never an unretrieved task error
            self._log.exception("acking %d message(s) without waiting failed", total)
            return
        _log_failures(self._log, failures, total)

    async def stop(self) -> None:
        """Refuse new ones; wait for those under way, at most CLOSE_WAIT_S, then cancel the rest."""
        self._stopped = True
        await self.loop_ended()

    async def loop_ended(self) -> None:
        """Wait for those under way (re-sends included), at most CLOSE_WAIT_S, then cancel the rest."""
        if not self._tasks:
            return
        _, left = await asyncio.wait(list(self._tasks), timeout=CLOSE_WAIT_S)
        _log_left(self._log, len(left))
        for task in left:
            self._resends.pop(task, None)
            task.cancel()


class ThreadAcks:
    """The blocking consumer's acks not waited for: daemon threads send them, all those queued at once (at most
    MAX_UNWAITED_ACKS), so an ack call retrying against a broker that does not answer holds up no other —
    tests/unit/sdk/test_ack_nowait.py::test_the_blocking_client_sends_an_ack_while_an_earlier_one_hangs. A thread is
    started only when none is free and ends after THREAD_IDLE_S without work —
    tests/unit/sdk/test_ack_nowait.py::test_the_blocking_client_sends_acks_one_after_another_on_one_thread. A
    consumer never closed stops them at interpreter exit as `close` would (at most CLOSE_WAIT_S), so they never
    hold the exit up longer —
    tests/unit/sdk/test_ack_nowait.py::test_an_unclosed_consumers_acks_hold_exit_up_at_most_the_close_wait."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._at_exit = False  # `stop` registered to run at interpreter exit
        self._stopped = False
        self._restart()
        _live_thread_acks.add(self)

    def _restart(self) -> None:
        """No thread, nothing queued or under way. A forked child starts so, since none of the parent's threads
        is in it — tests/unit/sdk/test_fork.py::test_a_forked_childs_unwaited_acks_are_sent."""
        self._lock = threading.RLock()  # a signal handler's close() may take it on a thread holding it
        self._slots = threading.BoundedSemaphore(MAX_UNWAITED_ACKS)  # queued or under way
        self._queue: queue.SimpleQueue[_Queued | None] = queue.SimpleQueue()
        self._threads: set[threading.Thread] = set()
        self._free = 0  # threads waiting for an ack no one queued yet
        self._futures: set[concurrent.futures.Future[None]] = set()
        self._stop_done = threading.Event()  # set once the first `stop` is over
        if self._stopped:
            self._stop_done.set()

    def start(self, send: Callable[[], Failures], total: int) -> None:
        """Queue `send` (the ack calls of `total` messages); returns once queued, after one of those queued or under
        way ended when MAX_UNWAITED_ACKS are. Unavailable once `stop` began."""
        if self._stopped:  # at once, not after a slot the acks under way hold
            raise _closed()
        self._slots.acquire()  # given back when that ack ends or is cancelled (`_ended`)
        with self._lock:
            if self._stopped:
                self._slots.release()
                raise _closed()
            if self._free:  # taken and queued under the lock: a free thread never ends with an ack queued for it
                self._free -= 1
            else:
                try:
                    self._start_thread()
                except RuntimeError as exc:  # the OS refused a thread: this ack fails, holding no slot
                    self._slots.release()
                    raise _no_thread(exc) from exc
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._futures.add(future)
            self._queue.put((future, send, total))
        future.add_done_callback(self._ended)

    def _start_thread(self) -> None:
        if not self._at_exit:
            self._at_exit = True
            atexit.register(self.stop)
        thread = threading.Thread(target=self._run, name="popgate-ack", daemon=True)
        thread.start()  # recorded once started, so `stop` joins only started threads
        self._threads.add(thread)

    def _ended(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._futures.discard(future)
        self._slots.release()

    def _run(self) -> None:
        while True:
            try:
                queued = self._queue.get(timeout=THREAD_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._free -= 1
                        self._threads.discard(threading.current_thread())
                        return
                continue
            if queued is None:  # `stop`
                return
            future, send, total = queued
            sending = future.set_running_or_notify_cancel()  # False: cancelled by `stop` while queued
            if sending:
                self._logged(send, total)
            with self._lock:
                self._free += 1  # before the future ends: a `start` after it finds this thread free
            if sending:
                future.set_result(None)

    def _logged(self, send: Callable[[], Failures], total: int) -> None:
        try:
            failures = send()
        except Exception:  # a bug, not a failed ack: logged, never lost in the thread
            self._log.exception("acking %d message(s) without waiting failed", total)
            return
        _log_failures(self._log, failures, total)

    def stop(self) -> None:
        """Refuse new ones; wait for those queued or under way, at most CLOSE_WAIT_S, then cancel the queued rest
        (those under way end within their deadlines, on their own, or with the interpreter). A second call returns
        once the first one's wait is over —
        tests/unit/sdk/test_ack_nowait.py::test_a_second_close_of_the_blocking_client_waits_for_the_first_ones_wait."""
        with self._lock:
            first, self._stopped = not self._stopped, True
            threads, futures = list(self._threads), list(self._futures)
        if not first:
            self._stop_done.wait()
            return
        try:
            self._stop(threads, futures)
        finally:
            self._stop_done.set()

    def _stop(self, threads: list[threading.Thread], futures: list[concurrent.futures.Future[None]]) -> None:
        atexit.unregister(self.stop)
        _, left = concurrent.futures.wait(futures, timeout=CLOSE_WAIT_S)
        _log_left(self._log, len(left))
        for future in left:
            future.cancel()
        for _ in threads:
            self._queue.put(None)  # each thread ends after the ack it is sending, if any
        if not left:
            for thread in threads:
                thread.join()


_live_thread_acks = restarted_after_fork(ThreadAcks._restart)
