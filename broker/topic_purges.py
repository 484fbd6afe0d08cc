"""A deleted topic's messages, deleted in steps once its purge committed (broker.admin's DeleteTopic): each step a
bounded transaction of the store's writer between other commits, followed by a pause as long, as retention's
deletions go, so deleting a topic of millions of messages holds no other topic's sends. Until its last step the
topic stays `purging` (StateCommits): made again, its new offsets would clash with the old rows."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.store import Store
from popgate_contract.errors import StoreUnavailable

if TYPE_CHECKING:
    from popgate_pb import broker_pb2 as pb

log = logging.getLogger(__name__)

RETRY_S = 1.0  # a step the store refused (disk full, read-only) is tried again this much later


def _future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


@dataclass
class TopicDeletion:
    """One DeleteTopic under way (broker.admin), for the requests that meet it: `answer` is its answer once its purge
    committed (None when it deleted nothing: refused, or retention's left the topic), `ended` is set once it ended."""

    answer: asyncio.Future[pb.DeleteTopicResponse | None] = field(default_factory=_future)  # type: ignore[arg-type]
    ended: asyncio.Future[None] = field(default_factory=_future)


class TopicPurges:
    """The topics whose rows are being deleted, one task each; `gone(topic)` once a topic's last rows went in a step
    that began after its latest `start` — tests/unit/broker/test_topic_purges.py."""

    def __init__(self, store: Store, gone: Callable[[str], None]) -> None:
        self.store = store
        self._gone = gone
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._asked: dict[str, int] = {}  # by topic: how many times `start` was called
        self._waiters: dict[str, asyncio.Future[None]] = {}  # by topic: set once its rows are gone (`deleted`)
        # One step at a time, whatever the topics: steps of topics deleted together (or resumed together at a start)
        # take their turns, each with its pause, and never queue up in the writer ahead of other commits.
        self._turn = asyncio.Lock()
        self._closed = False

    def __contains__(self, topic: object) -> bool:
        return topic in self._tasks

    def start(self, topic: str) -> None:
        """Delete `topic`'s rows (a purge of it committed, or a start found it purging). Called while a deletion of
        it runs, that deletion ends only with a step begun after this call: a purge committed after its last step
        began marks the topic purging again in the store, and only a later step unmarks it."""
        if self._closed:  # a purge committed as the broker stops: the next start resumes its deletion
            return
        self._asked[topic] = self._asked.get(topic, 0) + 1
        if topic not in self._tasks:
            log.info("deleting the rows of deleted topic %s", topic)
            self._tasks[topic] = asyncio.get_running_loop().create_task(self._run(topic))

    async def deleted(self, topic: str) -> None:
        """Return once no deletion of `topic`'s rows runs (at once when none does)."""
        if topic not in self._tasks:
            return
        waiter = self._waiters.get(topic)
        if waiter is None:
            waiter = self._waiters[topic] = asyncio.get_running_loop().create_future()
        await asyncio.shield(waiter)

    async def _run(self, topic: str) -> None:
        loop = asyncio.get_running_loop()
        rows = 0
        while True:
            asked = self._asked[topic]
            async with self._turn:
                started = loop.time()
                try:
                    last, deleted = await self.store.purge_step(topic)
                    rows += deleted
                except StoreUnavailable:
                    await asyncio.sleep(RETRY_S)
                    continue
                except Exception as exc:  # a bug's: logged; the topic stays purging until a start or a repeat
                    log.exception("deleting the rows of deleted topic %s failed", topic)
                    del self._tasks[topic], self._asked[topic]
                    if (waiter := self._waiters.pop(topic, None)) is not None:
                        waiter.set_exception(exc)
                    return
                if last and self._asked[topic] == asked:
                    log.info("deleted the rows of deleted topic %s (%d batch rows)", topic, rows)
                    del self._tasks[topic], self._asked[topic]  # no await between this and `gone`
                    self._gone(topic)
                    if (waiter := self._waiters.pop(topic, None)) is not None:
                        waiter.set_result(None)
                    return
                if not last:
                    await asyncio.sleep(loop.time() - started)  # the writer as long idle as it was deleting

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for waiter in self._waiters.values():
            waiter.cancel()
