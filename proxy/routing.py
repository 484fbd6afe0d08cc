"""Which broker serves a request. Pure: no sockets, no clocks.

Sends rotate over live brokers (round robin), or hash a message group to a fixed
broker (rendezvous hashing over every configured broker: a group moves only while its
own broker is down, not when another one's health changes); the brokers after the first
choice are the fail-over order. Brokers
that are down come last, so a request is still tried when every health check is
stale; a broker whose sends keep timing out comes after the other live ones
(`SlowSends`). Acks go to the broker named in the receipt handle.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from popgate_contract.errors import BrokerNotReached, DomainError, InvalidReceiptHandle
from popgate_contract.receipt import broker_of
from proxy.ports import BrokerClient
from proxy.settings import BROKER_NAME

MAX_ROTATIONS = 10_000  # rotation names kept (a group's receives: one each), the longest unused dropped first


class BrokerPool:
    def __init__(self, clients: Mapping[str, BrokerClient], *, first_turn: int | None = None) -> None:
        self._clients = dict(clients)
        self._names = sorted(self._clients)
        self._next: dict[str, int] = {}
        # Each proxy starts its rotations at a random broker, so that proxies started together do not all long-poll
        # the same broker first (docs/SCALE.md) —
        # tests/unit/proxy/test_core.py::test_each_pool_starts_its_rotation_at_a_random_broker.
        self._first_turn = random.randrange(1 << 16) if first_turn is None else first_turn
        self._random = first_turn is None  # new rotations start at random brokers (not when a test fixes it)
        # Set under broker discovery, told the name: a receipt handle names a broker this proxy has not found (yet:
        # each proxy looks DNS up on its own, another may have found it first). Then answered as a down broker's
        # (retriable) instead of as the client's error — tests/unit/proxy/test_discovery.py::
        # test_under_discovery_a_handle_naming_a_broker_not_found_yet_is_retriable_and_asks_for_a_lookup.
        self.unknown_broker: Callable[[str], None] | None = None

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def live(self) -> list[BrokerClient]:
        return [self._clients[n] for n in self._names if self._clients[n].healthy]

    def candidates(
        self, key: str | None = None, *, rotation: str = "send", last: Collection[str] = ()
    ) -> list[BrokerClient]:
        """Every broker in the order to try: the choice first, then fail-over (live before down).

        Live brokers named in `last` (`SlowSends.last`) come after the other live ones, which rotate among themselves
        (so they share those brokers' turns evenly); when every live broker is named, they rotate as before.

        Without a key the choice rotates; each `rotation` name has its own turn (sends one, each topic and group's
        receives theirs: a group's receives interleaved with others' at a fixed ratio would otherwise always land on
        the same brokers — test_coupled.py::test_a_groups_receives_rotate_over_the_brokers_whatever_others_do).
        """
        names = self._names if key is None else self.order(key)  # a group's broker first, whichever are live
        live = [n for n in names if self._clients[n].healthy]
        down = [n for n in names if not self._clients[n].healthy]
        slow: list[str] = []
        if last:
            rest = [n for n in live if n not in last]
            if rest:
                slow = [n for n in live if n in last]
                live = rest
        if live and key is None:
            turn = self._next.pop(rotation, None)
            if turn is None:  # a new rotation, or one dropped as the longest unused: at a random broker (one that
                # went on from a fixed start would meet the same broker each time the groups in turn are as many)
                turn = random.randrange(1 << 16) if self._random else self._first_turn
            self._next[rotation] = turn + 1  # last used last: the rotations left unused longest go first
            if len(self._next) > MAX_ROTATIONS:
                del self._next[next(iter(self._next))]
            start = turn % len(live)
            live = live[start:] + live[:start]
        return [self._clients[n] for n in live + slow + down]

    def order(self, key: str) -> list[str]:
        """Every broker's name in `key`'s order (rendezvous): the order `candidates(key)` tries them in, live ones
        first."""
        return sorted(self._names, key=lambda n: _weight(n, key), reverse=True)

    def get(self, name: str) -> BrokerClient | None:
        return self._clients.get(name)

    def put(self, client: BrokerClient) -> BrokerClient | None:
        """Add a broker (broker discovery), or replace the client of its name; returns the client replaced.

        Runs that name the broker find the new client from their next call on."""
        replaced = self._clients.get(client.name)
        self._clients[client.name] = client
        self._names = sorted({*self._names, client.name})
        return replaced

    def retire(self, name: str) -> BrokerClient | None:
        """Take a broker out of routing (gone from discovery); `get` and `for_handle` still find its client, which
        stays down, so runs and receipt handles naming it end as for a down broker —
        tests/unit/proxy/test_discovery.py::test_a_retired_broker_leaves_routing_but_its_handles_still_resolve."""
        self._names = [n for n in self._names if n != name]
        return self._clients.get(name)

    def clients(self) -> list[BrokerClient]:
        """Every client, retired ones too."""
        return list(self._clients.values())

    def for_handle(self, handle: str) -> BrokerClient:
        """The broker a receipt handle belongs to; InvalidReceiptHandle when garbled or unknown (under discovery, an
        unknown broker name is BrokerNotReached: `unknown_broker`)."""
        name = broker_of(handle)  # raises InvalidReceiptHandle: the broker's class is the proxy's
        client = self._clients.get(name)
        if client is None:
            raise self._unknown(name)
        return client

    def by_broker(
        self, handles: Sequence[str]
    ) -> tuple[dict[str, tuple[BrokerClient, list[int]]], list[tuple[int, DomainError]]]:
        """The indexes of `handles` by the broker each belongs to (brokers in the order of their first handle), and
        the index and error of each handle `for_handle` refuses, with the error it raises —
        tests/unit/proxy/test_core_receive.py::test_ack_routes_each_handle_to_its_broker_and_reports_per_handle."""
        by_name: dict[str, list[int]] = {}
        refused: list[tuple[int, DomainError]] = []
        for index, handle in enumerate(handles):
            try:
                name = broker_of(handle)  # one read of each handle; the broker's client once per broker
            except InvalidReceiptHandle as exc:
                refused.append((index, exc))
                continue
            indexes = by_name.get(name)
            if indexes is None:
                by_name[name] = [index]
            else:
                indexes.append(index)
        groups: dict[str, tuple[BrokerClient, list[int]]] = {}
        for name, indexes in by_name.items():
            client = self._clients.get(name)
            if client is None:
                error = self._unknown(name)
                refused += ((i, error) for i in indexes)
            else:
                groups[name] = (client, indexes)
        return groups, refused

    def _unknown(self, name: str) -> DomainError:
        if self.unknown_broker is not None and BROKER_NAME.fullmatch(name):
            self.unknown_broker(name)
            return BrokerNotReached(f"receipt handle names broker {name!r}, not found by this proxy yet: retry shortly")
        shown = name if len(name) <= 64 else name[:64] + "…"  # a made-up handle's name is echoed in every entry
        return InvalidReceiptHandle(f"receipt handle names broker {shown!r}, which this proxy does not know")


class TopicMisses:
    """Brokers that just answered TOPIC_NOT_FOUND for a topic (brokers with --no-auto-create holding it on some
    brokers only): tried last for that topic for `last_s`, so a send does not spend a round trip there first each
    time — tests/unit/proxy/test_core.py::test_a_broker_that_lacks_the_topic_is_tried_last_for_it. Bounded: past
    `limit` entries the oldest are forgotten."""

    def __init__(self, *, last_s: float = 5.0, limit: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self._last_s = last_s
        self._limit = limit
        self._clock = clock
        self._until: dict[tuple[str, str], float] = {}  # (topic, broker) -> tried last until; insertion order

    def missed(self, topic: str, broker: str) -> None:
        key = (topic, broker)
        self._until.pop(key, None)
        self._until[key] = self._clock() + self._last_s
        if len(self._until) > self._limit:
            del self._until[next(iter(self._until))]

    def last(self, topic: str, clients: Sequence[BrokerClient]) -> list[BrokerClient]:
        """`clients` in order, those that just missed `topic` moved to the end (in their order)."""
        if not self._until:
            return list(clients)
        now = self._clock()
        missing = [c for c in clients if self._until.get((topic, c.name), 0.0) > now]
        if not missing:
            return list(clients)
        return [c for c in clients if c not in missing] + missing


class SlowSends:
    """Brokers whose sends timed out `after` times in a row, their health checks passing or not (a store commit or
    Session handler stuck behind a stalled disk answers health SERVING): unkeyed sends try them last, so that they
    do not hold every other send for the broker timeout. One send tries such a broker first (a probe) `last_s`
    later, then at intervals doubling up to `max_last_s` (each probe unanswered holds its sender for the broker
    timeout); a send it stores, or its health checks seeing it come back up (`forget`), puts it back in the rotation
    at once — tests/unit/proxy/test_slow_sends.py. Pure: the proxy reports each send's outcome and asks the order."""

    def __init__(
        self,
        *,
        after: int = 3,
        last_s: float = 5.0,
        max_last_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.after = after
        self.last_s = last_s
        self._max_last_s = max_last_s
        self._clock = clock
        self._row: dict[str, int] = {}  # sends timed out in a row, by broker (only those with one: a send pays a pop)
        self._probe_at: dict[str, tuple[float, float]] = {}  # brokers sent to last -> next probe's time, interval
        self.last: frozenset[str] = frozenset()  # those brokers (empty: a send pays a truth test)
        self.generation = 0  # counts the brokers put last; a send notes it as it starts (`answered`)
        self._since: dict[str, int] = {}  # brokers sent to last -> the generation that put them there

    def timed_out(self, broker: str) -> bool:
        """A send to `broker` timed out; True when that puts it last (it was not)."""
        row = self._row[broker] = self._row.get(broker, 0) + 1
        if row < self.after or broker in self._probe_at:
            return False
        self._probe_at[broker] = (self._clock() + self.last_s, self.last_s)
        self.generation += 1
        self._since[broker] = self.generation
        self.last = frozenset(self._probe_at)
        return True

    def answered(self, broker: str, started: int) -> bool:
        """A send to `broker` that started at generation `started` was stored; True when that takes it back from
        last: only a send started after it was put last does (one started before says nothing of it now) —
        tests/unit/proxy/test_slow_sends.py::test_sends_started_before_a_broker_was_put_last_do_not_take_it_back."""
        self._row.pop(broker, None)
        since = self._since.get(broker)
        return since is not None and started >= since and self._back(broker)

    def forget(self, broker: str) -> bool:
        """`broker` came back up after being down (restarted): a new row; True when that takes it back from last."""
        self._row.pop(broker, None)
        return self._back(broker)

    def _back(self, broker: str) -> bool:
        self._since.pop(broker, None)
        if self._probe_at.pop(broker, None) is None:
            return False
        self.last = frozenset(self._probe_at)
        return True

    def probe(self) -> str | None:
        """A broker sent to last that this send should try first, or None."""
        now = self._clock()
        for broker, (at, interval) in self._probe_at.items():
            if at <= now:
                interval = min(2 * interval, self._max_last_s)
                self._probe_at[broker] = (now + interval, interval)
                return broker
        return None


def _weight(broker: str, key: str) -> int:
    """A broker's rendezvous weight for a key: a well-mixed hash, so that message groups spread evenly over the
    brokers (a linear one such as CRC32 does not: for names of one length the XOR of two brokers' CRCs is the same
    for every key) —
    tests/unit/proxy/test_core.py::test_message_groups_spread_evenly_and_a_lost_brokers_groups_spread_over_the_others.
    """
    return int.from_bytes(hashlib.blake2b(f"{broker}\0{key}".encode(), digest_size=8).digest(), "big")
