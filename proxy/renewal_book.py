"""The pure part of auto_renew renewal (`proxy.renewal` drives it), without clock or sockets.

`RenewalBook`: per client, the handles it was given with their next renewal time, and which clients are alive (a
Heartbeat or ReceiveMessage from it within `alive_s`, or within `stream_alive_s` while a Telemetry stream of it is open
on this proxy, as RocketMQ's proxy counts a client alive while its heartbeats come). With accounts, a client is its id
as used by one account (`owner`): another account sending the same id neither ends nor keeps alive what it holds.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

RENEWALS_PER_INVISIBLE = 4  # renewed every quarter of the invisible time: a failed call has two more tries left
MAX_HEARD = 100_000  # client ids remembered as heard from (ids are the client's own: bounded)


def owner(client: str, account: str) -> str:
    """Whom the book's entries belong to: the client id, qualified by the caller's access key when accounts are on.
    gRPC metadata values hold no newline, so the key and the id are told apart whatever they are."""
    return f"{account}\n{client}" if account and client else client


def client_id_of(owner: str) -> str:
    """The client id of an `owner`, as other proxies report it (without its account)."""
    return owner.rpartition("\n")[2]


def renewal_period_s(invisible_s: float) -> float:
    """How often a handle given `invisible_s` is renewed. Every quarter: after a renewal at r (deadline r + T) the
    tries come at r + T/4, T/2, 3T/4 (each a tick late at most), so a call failing at r + T/4 has two more before
    the deadline. Every third left only one: the third try, a few ticks late, came after the deadline."""
    return invisible_s / RENEWALS_PER_INVISIBLE


@dataclass(frozen=True, slots=True)
class RenewalLimits:
    period_s: float  # renew this long after the receive, and after each renewal
    max_renew_s: float = 3 * 3600.0  # no renewal after this long since the receive (RocketMQ's renewMaxTimeMillis)
    max_per_client: int = 10_000  # handles tracked per client id; beyond: not renewed
    max_total: int = 200_000  # handles tracked in all; beyond: not renewed
    alive_s: float = 30.0  # a client heard from (Heartbeat, ReceiveMessage) is alive this long: 3 of the official
    # clients' heartbeats (every 10 s)
    stream_alive_s: float = 120.0  # as long with a Telemetry stream open here: RocketMQ's proxy drops a client's
    # channel after 120 s without a heartbeat, open or not — a frozen process keeps its stream open


@dataclass(slots=True)
class Tracked:
    handle: str
    client: str
    group: str
    broker: str
    due: float  # next renewal (loop time)
    until: float  # no renewal after this
    live: bool = True  # False once forgotten: its place in the due queue is skipped


@dataclass(slots=True)
class Due:
    """What `RenewalBook.take_due` hands the driver: handles to renew by (broker, group), how many stopped being
    renewed, by reason (max_time, client_gone), and by group the clients unheard here whose handles came due (renewed
    this once, while the driver asks whether another proxy reports them live: `RenewalBook.answered`)."""

    batches: dict[tuple[str, str], list[str]]
    ended: Counter[str]
    asks: dict[str, set[str]] = field(default_factory=dict)


class RenewalBook:
    """Per client id, the auto_renew handles it holds and their next renewal time. O(1) per handle for
    tracking and forgetting; one due queue, kept in due order without a heap because every renewal is
    `period_s` after its receive or its last renewal."""

    def __init__(self, limits: RenewalLimits) -> None:
        self.limits = limits
        self._streams: dict[str, int] = {}  # client id -> Telemetry streams open on this proxy
        self._heard: OrderedDict[str, float] = OrderedDict()  # client id -> when last heard from, oldest first
        self._clients: dict[str, dict[str, Tracked]] = {}  # client id -> its handles
        self._handles: dict[str, Tracked] = {}
        self._queue: deque[Tracked] = deque()  # due order; forgotten entries skipped lazily
        self._dead = 0  # forgotten entries still in `_queue`

    def __len__(self) -> int:
        return len(self._handles)

    def alive(self, client: str, now: float) -> bool:
        """Heard from within `alive_s`, or within `stream_alive_s` with a Telemetry stream open here: an open stream
        alone is no sign of life (tests/unit/proxy/test_renewal.py::
        test_a_client_with_its_stream_open_but_silent_for_stream_alive_s_is_gone)."""
        at = self._heard.get(client)
        return at is not None and now - at < self._alive_s(client)

    def _alive_s(self, client: str) -> float:
        return self.limits.stream_alive_s if client in self._streams else self.limits.alive_s

    @property
    def heard_from(self) -> int:
        """Client ids remembered as heard from (bounded by MAX_HEARD; the expired leave as others come)."""
        return len(self._heard)

    def heard(self, client: str, now: float) -> None:
        """A Heartbeat or ReceiveMessage of this client came: alive for `alive_s` more. A proxy restarted under a
        running PushConsumer learns of it so, not only when the client next rebuilds its Telemetry stream (the
        official client does that only when a settings write fails: every 300 s)."""
        if not client:
            return
        heard = self._heard
        heard[client] = now
        heard.move_to_end(client)
        while heard:  # the expired and those over the bound leave from the oldest end
            oldest, at = next(iter(heard.items()))
            if now - at < self._alive_s(oldest) and len(heard) <= MAX_HEARD:
                break
            heard.popitem(last=False)

    def opened(self, client: str) -> None:
        """A Telemetry stream of this client opened: while one is open, it is alive `stream_alive_s` once heard."""
        self._streams[client] = self._streams.get(client, 0) + 1

    def closed(self, client: str) -> None:
        """One of its Telemetry streams ended. Once none is open and it is not heard from for `alive_s`, its
        handles are dropped when they next come due (`take_due`): a client rebuilding its stream keeps them."""
        left = self._streams.get(client, 0) - 1
        if left > 0:
            self._streams[client] = left
        else:
            self._streams.pop(client, None)

    def terminated(self, client: str, group: str = "") -> list[Tracked]:
        """NotifyClientTermination: drop its handles (of `group` only, when given) now; the dropped ones (to be made
        visible again soon)."""
        self._heard.pop(client, None)
        handles = self._clients.get(client, {})
        dropped = [t for t in handles.values() if not group or t.group == group]
        for tracked in dropped:
            self._remove(tracked)
        return dropped

    def track(self, client: str, group: str, handles: Iterable[tuple[str, str]], now: float) -> Counter[str]:
        """Renew these (broker, handle) pairs for `client` (the receive itself is a sign of life); how many are not
        renewed, by reason: no_client_id (the receive named no client: nobody to watch), client_limit, total_limit."""
        refused: Counter[str] = Counter()
        self.heard(client, now)
        if not self.alive(client, now):
            refused["no_client_id"] = sum(1 for _ in handles)
            return refused
        mine = self._clients.setdefault(client, {})
        limits = self.limits
        due, until = now + limits.period_s, now + limits.max_renew_s
        for broker, handle in handles:
            if handle in self._handles:
                continue
            if len(mine) >= limits.max_per_client:
                refused["client_limit"] += 1
            elif len(self._handles) >= limits.max_total:
                refused["total_limit"] += 1
            else:
                tracked = Tracked(handle, client, group, broker, due, until)
                mine[handle] = self._handles[handle] = tracked
                self._queue.append(tracked)
        if not mine:
            del self._clients[client]
        return refused

    def forget(self, handles: Iterable[str]) -> int:
        """Acked, changed or dead-lettered through this proxy, or stale at the broker: no more renewal; how many
        of them were tracked."""
        if not self._handles:  # no PushConsumer here: every ack passes through, nothing to look up
            return 0
        count = 0
        for handle in handles:
            tracked = self._handles.get(handle)
            if tracked is None:
                continue
            count += 1
            self._remove(tracked)
        return count

    def _remove(self, tracked: Tracked, *, queued: bool = True) -> None:
        mine = self._clients.get(tracked.client)
        if mine is not None:
            mine.pop(tracked.handle, None)
            if not mine:
                del self._clients[tracked.client]
        self._drop(tracked, queued=queued)

    def _drop(self, tracked: Tracked, *, queued: bool = True) -> None:
        """Out of the handle index; its entry in the due queue (`queued`) is skipped when reached."""
        del self._handles[tracked.handle]
        tracked.live = False
        if not queued:
            return
        self._dead += 1
        if self._dead > len(self._handles) + 1024:  # mostly dead: rebuild the queue (it keeps its order)
            self._queue = deque(t for t in self._queue if t.live)
            self._dead = 0

    def take_due(self, now: float, *, ask: bool = False) -> Due:
        """The handles due for renewal now, by (broker, group); each is due again `period_s` later. Handles past
        their `max_renew_s` are dropped instead, and those of a client no longer alive here too — unless `ask`:
        then they are renewed and their client asked about (`Due.asks`)."""
        out = Due({}, Counter())
        queue, period = self._queue, self.limits.period_s
        while queue and queue[0].due <= now:
            tracked = queue.popleft()
            if not tracked.live:
                self._dead -= 1
                continue
            gone = tracked.until > now and not self.alive(tracked.client, now)
            if ask and gone:
                out.asks.setdefault(tracked.group, set()).add(tracked.client)
            elif tracked.until <= now or gone:
                out.ended["client_gone" if gone else "max_time"] += 1
                self._remove(tracked, queued=False)
                continue
            out.batches.setdefault((tracked.broker, tracked.group), []).append(tracked.handle)
            tracked.due = now + period
            queue.append(tracked)
        return out

    def answered(self, asks: dict[str, set[str]], reported: dict[str, set[str] | None], now: float) -> int:
        """Which of the clients `take_due` asked about other proxies report live, by group (None: no broker answered:
        not live). One reported in a group it was asked for counts as heard from now; the others, unless heard here
        since, are gone: their handles dropped (how many)."""
        live = {c for group, clients in asks.items() for c in clients if client_id_of(c) in (reported.get(group) or ())}
        dropped = 0
        for client in {c for clients in asks.values() for c in clients} - live:
            if not self.alive(client, now):
                handles = list(self._clients.get(client, {}).values())
                for tracked in handles:
                    self._remove(tracked)
                dropped += len(handles)
        for client in live:
            self.heard(client, now)
        return dropped
