"""Every live broker learns of a consumer group from the group's first receive of a topic through this proxy, and
every broker that comes up later learns of the groups the proxy received most recently.

A broker keeps a group's state on a topic (where it starts, what it has acked, so its lag) from the
group's first Pop or Notification there, and a receive answered by its first Pop asks one broker only.
So the first receive of (topic, group) on a proxy also sends a Notification with poll 0 to every live
broker: it consumes nothing and is answered at once, and the broker fixes the group's start there. A
group's backlog on any live broker then counts in every lag figure (broker /metrics, `popgate stats`, the
Spark job), and under `latest` its start on each broker is the moment the group came, not the moment a
receive first reached that broker — tests/unit/proxy/receive/test_notify_driver.py::
test_a_groups_first_receive_announces_it_to_every_live_broker_once.

A broker that comes up (discovery adds it or finds it moved, a listed one down at the first receive comes back,
one restarted on an empty data directory) is told the same way of the most recent `MAX_EARLY_LOOKS` remembered
pairs, `in_flight` calls at a time, the least recently received first: a broker without the topic yet keeps that
many early looks, forgetting the least recent, so the groups in use are the ones it keeps —
tests/unit/proxy/receive/test_announce.py::test_a_broker_that_comes_up_is_told_the_most_recent_pairs_it_keeps_oldest_first.
Until that round has ended, at most `hold_s`, sends go to it only when no other live broker takes them
(`send_order`), so that no send creates a topic there before its groups are announced —
tests/integration/proxy/test_group_announce.py. At a broker that knows the group an announcement changes
nothing: only a group's first look there fixes its start, later ones never move an offset.

Per proxy and bounded (the most recent `capacity` pairs): a proxy restarted, or a pair forgotten, only
announces again, which changes nothing at a broker that knows the group.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from popgate_pb import broker_pb2 as bpb

from popgate_contract.consumers import MAX_EARLY_LOOKS
from proxy.ports import BrokerClient

log = logging.getLogger(__name__)
IN_FLIGHT = 64  # announcements one broker that came up has at a time
HOLD_S = 5.0  # the longest a broker that came up is tried last by sends while its announcements go out


class GroupsSeen:
    """The (topic, group) pairs this proxy has announced, the most recent `capacity` of them, each with the filter of
    its latest receive. Pure."""

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity {capacity!r} must be >= 1")
        self._capacity = capacity
        self._seen: OrderedDict[tuple[str, str], str] = OrderedDict()

    def first_sight(self, topic: str, group: str, tag_filter: str = "*") -> bool:
        """True the first time (topic, group) comes, or again once it was forgotten."""
        key = (topic, group)
        known = key in self._seen
        self._seen[key] = tag_filter
        if known:
            self._seen.move_to_end(key)
            return False
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return True

    def pairs(self, most: int | None = None) -> list[tuple[str, str, str]]:
        """The `most` most recently received (topic, group, filter) (every one by default), the least recent
        first."""
        items = list(self._seen.items())
        if most is not None:
            items = items[max(0, len(items) - most) :]
        return [(topic, group, tag_filter) for (topic, group), tag_filter in items]

    def forget(self, *, topic: str = "", group: str = "") -> None:
        """Forget the pairs of `group` (on `topic`, or on every topic when empty), or every pair of `topic`: deleted by
        an admin, they are not announced to a broker that comes up (which would give the deleted group its state
        back there) — test_announce.py::test_a_deleted_group_or_topic_is_not_announced_to_a_broker_that_comes_up."""
        for key in [k for k in self._seen if (not group or k[1] == group) and (not topic or k[0] == topic)]:
            del self._seen[key]

    def __contains__(self, pair: object) -> bool:
        """Whether (topic, group) is remembered."""
        return pair in self._seen

    def __len__(self) -> int:
        return len(self._seen)


def _outcome_ignored(call: asyncio.Future[Any]) -> None:
    if not call.cancelled():
        call.exception()  # retrieved: a failed announcement is not an error of the receive


class Announcer:
    """Sends the announcements: a pair's first receive to every live broker, the most recent pairs to a broker that
    came up."""

    def __init__(
        self,
        *,
        timeout_s: float,
        in_flight: int = IN_FLIGHT,
        capacity: int = 100_000,
        most: int = MAX_EARLY_LOOKS,
        hold_s: float = HOLD_S,
    ) -> None:
        self.seen = GroupsSeen(capacity)
        self._timeout_s = timeout_s
        self._in_flight = in_flight
        self._most = most
        self._hold_s = hold_s
        self._to: dict[str, asyncio.Task[None]] = {}  # a broker's round of announcements, by broker name
        self._held_until: dict[str, float] = {}  # loop time until which sends try a broker in `_to` last

    def received(self, topic: str, group: str, tag_filter: str, live: Iterable[BrokerClient]) -> None:
        """A receive of (topic, group): on its first sight, announced to the `live` brokers (not awaited: a broker
        that fails it learns of the group at its first Pop or Notification there)."""
        if self.seen.first_sight(topic, group, tag_filter):
            for client in live:
                self._begin(client, [(topic, group, tag_filter)])

    def broker_up(self, client: BrokerClient) -> None:
        """`client`'s broker came up: the most recent `most` pairs are announced to it, the least recent first, the
        first `in_flight` at once, the rest as those are answered; an earlier round to it ends. Until this round
        ends (at most `hold_s`), `send_order` puts the broker after the other live ones."""
        earlier = self._to.pop(client.name, None)
        if earlier is not None:
            earlier.cancel()
        pairs = self.seen.pairs(self._most)
        if not pairs:
            return
        first = self._begin(client, pairs[: self._in_flight])
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._rest(client, first, pairs[self._in_flight :]))
        self._to[client.name] = task
        self._held_until[client.name] = loop.time() + self._hold_s
        task.add_done_callback(lambda done: self._ended(client.name, done))
        loop.call_later(self._hold_s, self._overdue, client.name, task, len(pairs))

    def send_order(self, candidates: list[BrokerClient]) -> list[BrokerClient]:
        """`candidates` in the order a send tries them: a live broker whose announcements are still going out (for
        at most `hold_s` after it came up) after the other live ones, before the down ones (with none going out, the
        list itself: a send pays nothing more)."""
        if not self._to:
            return candidates
        now = asyncio.get_running_loop().time()
        return sorted(candidates, key=lambda c: (not c.healthy, now < self._held_until.get(c.name, 0.0)))

    def _ended(self, name: str, done: asyncio.Task[None]) -> None:
        if self._to.get(name) is done:
            del self._to[name]
            self._held_until.pop(name, None)

    def _overdue(self, name: str, task: asyncio.Task[None], count: int) -> None:
        if self._to.get(name) is task:
            log.warning(
                "broker %s: its %d group announcements have not all been answered within %g s; sends go to it"
                " again meanwhile (a group announced after a send created a topic there starts after that send"
                " under --consume-from latest)",
                name,
                count,
                self._hold_s,
            )

    def close(self) -> None:
        """Stop every announcement round under way."""
        for task in self._to.values():
            task.cancel()
        self._to.clear()
        self._held_until.clear()

    def _begin(self, client: BrokerClient, pairs: Sequence[tuple[str, str, str]]) -> list[asyncio.Future[Any]]:
        calls: list[asyncio.Future[Any]] = []
        for topic, group, tag_filter in pairs:
            request = bpb.NotificationRequest(topic=topic, group=group, filter=tag_filter)
            calls.append(client.begin_notification(request, timeout_s=self._timeout_s))
            calls[-1].add_done_callback(_outcome_ignored)
        return calls

    async def _rest(
        self, client: BrokerClient, calls: list[asyncio.Future[Any]], rest: Sequence[tuple[str, str, str]]
    ) -> None:
        """Wait for `calls`, then announce `rest` `in_flight` at a time while the broker stays up (down again, it is
        announced the pairs again when it is next up)."""
        await asyncio.gather(*calls, return_exceptions=True)  # cancelled with the task: so are the calls
        for start in range(0, len(rest), self._in_flight):
            if not client.healthy:
                return
            batch = [
                pair for pair in rest[start : start + self._in_flight] if pair[:2] in self.seen
            ]  # not deleted since
            await asyncio.gather(*self._begin(client, batch), return_exceptions=True)
