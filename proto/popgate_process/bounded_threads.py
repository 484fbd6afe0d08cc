"""Work taken off the event loop onto a few threads, bounded: how many jobs run or queue for a thread, and how many
wait for such a place (the proxy's GZIP bodies, `proxy/v2/send.py`; compressed gRPC requests, `h2grpc/stream.py`)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class BoundedThreads:
    """At most `places` jobs at a time on `threads` worker threads. A job past that waits its turn (first come, first
    served) until its deadline; past `waiting` such jobs, or at its deadline less `reserve_s`, `refused(why)` is
    raised — tests/unit/proxy/test_overload.py::
    test_sixteen_concurrent_gzip_requests_are_all_stored_while_at_most_four_inflate_at_once.

    A job counts until its thread finishes it, also when its caller has gone (a thread cannot be stopped), so the
    bound holds for the memory the jobs take —
    test_overload.py::test_gzip_conversions_past_the_bound_wait_within_their_deadline_until_their_threads_finish.
    """

    def __init__(
        self,
        *,
        threads: int,
        places: int,
        waiting: int,
        refused: Callable[[str], Exception],
        name: str,
        reserve_s: float = 0.0,
    ) -> None:
        self.places = places
        self.waiting = waiting
        self._refused = refused
        self._reserve_s = reserve_s
        self._free = places  # counted on the event loop only
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def run(self, job: Callable[[], T], *, deadline: float | None = None) -> T:
        """`job()` on a worker thread once a place is free; `deadline`: the caller's (loop time)."""
        await self._place(deadline)
        loop = asyncio.get_running_loop()
        try:
            future = self._pool.submit(job)
        except BaseException:
            self._release()
            raise
        future.add_done_callback(lambda _: self._release_from(loop))  # on the worker, when it is really done
        return await asyncio.wrap_future(future)

    async def _place(self, deadline: float | None) -> None:
        if self._free and not self._waiters:
            self._free -= 1
            return
        if len(self._waiters) >= self.waiting:
            raise self._refused(f"and {len(self._waiters)} wait for their turn")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            # Refused in time for the answer to reach the client before its own deadline.
            async with asyncio.timeout_at(None if deadline is None else deadline - self._reserve_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a place as it gave up: the next one gets it
            elif waiter in self._waiters:  # not skipped by a release already
                self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise self._refused("and this one's deadline came before its turn") from None
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the place goes to the first waiter as it is
                return
        self._free += 1

    def _release_from(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.call_soon_threadsafe(self._release)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
