"""The live consumers proxies report (pure, in memory): what `popgate consumers` lists from any proxy.

Each proxy knows only the clients it serves, so every proxy sends every broker its whole list every few seconds
(`ReportConsumers`, as RocketMQ clients heartbeat to brokers). A report replaces that proxy's previous one, and a
proxy that stops reporting is forgotten once its report's time to live passes, so any broker answers for every
proxy alive. Bounded: MAX_PROXIES reports of at most MAX_REPORTED consumers each, named as a proxy names them, and
MAX_KEPT_BYTES in all, so a ListConsumers answer of every report fits one gRPC message; nothing is stored (a broker
restart forgets them until the next reports, seconds later) — tests/unit/broker/test_consumers.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from popgate_contract.errors import BadRequest, TooManyRequests
from popgate_contract.validation import MAX_CLIENT_ID_CHARS, check_group

MAX_PROXIES = 1_000
MAX_REPORTED = 10_000
TTL_MS = (1_000, 600_000)  # the range of a report's time to live
# The reports kept, counted as the bytes of their consumers in a ListConsumers answer: under the broker's default
# 16 MiB gRPC message limit with the answer's own fields to spare, and over the largest report a proxy's own limits
# let it send (proxy.consumers.MAX_CONSUMERS of the longest group, client id and proxy names, about 8.8 MiB).
MAX_KEPT_BYTES = 15 * 1024 * 1024
ENTRY_OVERHEAD = 24  # the most a Consumer adds to an answer beyond its names: field tags, lengths, last_seen_ms


@dataclass(frozen=True, slots=True)
class Seen:
    group: str
    client_id: str
    proxy: str
    last_seen_ms: int


def answer_bytes(seen: Seen) -> int:
    """At least what `seen` adds to a ListConsumers answer."""
    names = len(seen.group.encode()) + len(seen.client_id.encode()) + len(seen.proxy.encode())
    return names + ENTRY_OVERHEAD


def _checked(seen: Seen, proxy: str) -> Seen:
    check_group(seen.group)
    if not seen.client_id or len(seen.client_id) > MAX_CLIENT_ID_CHARS:
        n = len(seen.client_id)
        raise BadRequest(f"a consumer report names a client id of {n} characters, 1..{MAX_CLIENT_ID_CHARS}")
    return Seen(seen.group, seen.client_id, proxy, seen.last_seen_ms)


class ConsumerRegistry:
    def __init__(self, *, max_bytes: int = MAX_KEPT_BYTES) -> None:
        self._reports: dict[str, tuple[int, list[Seen], int]] = {}  # proxy -> (forgotten after, consumers, bytes)
        self._max_bytes = max_bytes
        self._bytes = 0  # answer_bytes of every consumer kept

    def report(self, proxy: str, consumers: list[Seen], ttl_ms: int, now_ms: int) -> None:
        """`proxy`'s whole list, replacing its last one; kept `ttl_ms`. Refused (TooManyRequests) when it would
        take the reports kept past their bounds, the last one then kept until its own time."""
        if not proxy or len(proxy) > 255:
            raise BadRequest("a consumer report names its proxy (at most 255 characters)")
        if len(consumers) > MAX_REPORTED:
            raise BadRequest(f"a consumer report lists {len(consumers)} consumers, at most {MAX_REPORTED}")
        if not TTL_MS[0] <= ttl_ms <= TTL_MS[1]:
            raise BadRequest(f"a consumer report's time to live {ttl_ms} ms is outside {TTL_MS[0]}..{TTL_MS[1]} ms")
        seen = [_checked(c, proxy) for c in consumers]
        size = sum(answer_bytes(s) for s in seen)
        self.expire(now_ms)
        if proxy not in self._reports and len(self._reports) >= MAX_PROXIES:
            raise TooManyRequests(f"consumers of {MAX_PROXIES} proxies are kept already")
        others = self._bytes - (self._reports[proxy][2] if proxy in self._reports else 0)
        if others + size > self._max_bytes:
            raise TooManyRequests(f"consumer reports kept would take {others + size} bytes, at most {self._max_bytes}")
        self._reports[proxy] = (now_ms + ttl_ms, seen, size)
        self._bytes = others + size

    def expire(self, now_ms: int) -> None:
        for proxy in [p for p, (until, _, _) in self._reports.items() if until < now_ms]:
            self._bytes -= self._reports.pop(proxy)[2]

    def of_group(self, group: str, now_ms: int) -> list[Seen]:
        """The consumers of `group` (every group when empty) in the reports alive now, by group and client id."""
        self.expire(now_ms)
        found = [s for _, seen, _ in self._reports.values() for s in seen if not group or s.group == group]
        return sorted(found, key=lambda s: (s.group, s.client_id, s.proxy))
