"""The Session stream's outbox (`sdk/_session.py`): the requests waiting to be written, their bytes counted, a
request whose caller gave up taken out before it is written."""

from __future__ import annotations

import asyncio

from ._frames import Queued, size_of


class Outbox(asyncio.Queue[Queued | None]):
    """The requests waiting to be written: their bytes counted (`size`), and a request whose caller gave up taken
    out (`discard`) rather than kept to be written."""

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        self.size = 0
        self._items: dict[int, Queued] = {}  # a request's id: its item, while queued
        self._ids: dict[int, int] = {}  # id() of a queued request's item: its request's id
        self._left: asyncio.Future[None] | None = None  # resolved when queued bytes leave (see `shrunk`)

    def shrunk(self) -> asyncio.Future[None]:
        """Resolved the next time queued bytes leave the outbox (taken to be written, or taken out), or the stream
        ends (`wake`)."""
        if self._left is None or self._left.done():
            self._left = asyncio.get_running_loop().create_future()
        return self._left

    def wake(self) -> None:
        if self._left is not None and not self._left.done():
            self._left.set_result(None)

    def put_request(self, request_id: int, item: Queued) -> None:
        self._items[request_id], self._ids[id(item)] = item, request_id
        self.put_nowait(item)

    def queued(self, request_id: int) -> bool:
        """Whether the request is still waiting to be written."""
        return request_id in self._items

    def discard(self, request_id: int) -> bool:
        """Take the request out if it is still queued (then it was never written)."""
        item = self._items.pop(request_id, None)
        if item is None:
            return False
        del self._ids[id(item)]
        for i, queued in enumerate(self._queue):  # type: ignore[attr-defined]
            if queued is item:
                del self._queue[i]  # type: ignore[attr-defined]
                break
        self.size -= size_of(item)
        self.wake()
        return True

    def _put(self, item: Queued | None) -> None:
        self.size += 0 if item is None else size_of(item)
        super()._put(item)

    def _get(self) -> Queued | None:
        item = super()._get()
        if item is not None:
            self.size -= size_of(item)
            self.wake()
            if (request_id := self._ids.pop(id(item), None)) is not None:
                del self._items[request_id]
        return item
