"""The live consumers proxies report (pure, in memory): what `popgate consumers` lists from any proxy.

Each proxy knows only the clients it serves, so every proxy sends every broker its whole list every few seconds
(`ReportConsumers`, as RocketMQ clients heartbeat to brokers). A report replaces that proxy's previous one, and a
proxy that stops reporting is forgotten once its report's time to live passes, so any broker answers for every
proxy alive. Bounded: MAX_PROXIES reports of at most MAX_REPORTED consumers each, named as a proxy names them, and
MAX_KEPT_BYTES in all, so a ListConsumers answer of every report fits one gRPC message; nothing is stored (a broker
restart forgets them until the next reports, seconds later) — tests/unit/broker/test_consumers.py. Kept by group, as
lists of client ids and times: a group's listing reads that group only, a listing of every group its first
EVERY_GROUP_LIMIT consumers; a report costs a group name's check once per group and its client ids' lengths, and
gives the garbage collector nothing to walk per consumer
(test_a_kept_report_gives_the_garbage_collector_nothing_to_walk_per_consumer).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from popgate_contract.consumers import EVERY_GROUP_LIMIT
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


class Seen(NamedTuple):
    group: str
    client_id: str
    proxy: str
    last_seen_ms: int


class Reported(Protocol):
    """A consumer a report lists: a Seen, or the report's own Consumer message."""

    @property
    def group(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def last_seen_ms(self) -> int: ...


@dataclass(frozen=True, slots=True)
class _Report:
    until_ms: int  # forgotten after
    groups: dict[str, tuple[list[str], list[int]]]  # group -> its client ids, when each was last seen (ms)
    size: int  # at least what its consumers add to a ListConsumers answer


def _grouped(proxy: str, consumers: Sequence[Reported]) -> tuple[dict[str, tuple[list[str], list[int]]], int]:
    """`consumers` by group, and at least what they add to a ListConsumers answer (their names and ENTRY_OVERHEAD
    each); BadRequest when a name is one no proxy sends."""
    groups: dict[str, tuple[list[str], list[int]]] = {}
    for c in consumers:
        ids, seen_ms = groups.get(c.group) or groups.setdefault(c.group, ([], []))
        ids.append(c.client_id)
        seen_ms.append(c.last_seen_ms)
    size = (len(proxy.encode()) + ENTRY_OVERHEAD) * len(consumers)
    for group, (ids, _) in groups.items():
        check_group(group)
        if min(map(len, ids)) < 1 or max(map(len, ids)) > MAX_CLIENT_ID_CHARS:
            n = next(len(i) for i in ids if not 0 < len(i) <= MAX_CLIENT_ID_CHARS)
            raise BadRequest(f"a consumer report names a client id of {n} characters, 1..{MAX_CLIENT_ID_CHARS}")
        size += len(group.encode()) * len(ids) + sum(map(len, map(str.encode, ids)))
    return groups, size


class ConsumerRegistry:
    def __init__(self, *, max_bytes: int = MAX_KEPT_BYTES) -> None:
        self._reports: dict[str, _Report] = {}  # by proxy
        self._max_bytes = max_bytes
        self._bytes = 0  # the sizes of the reports kept

    def report(self, proxy: str, consumers: Sequence[Reported], ttl_ms: int, now_ms: int) -> None:
        """`proxy`'s whole list, replacing its last one; kept `ttl_ms`. Refused (TooManyRequests) when it would
        take the reports kept past their bounds, the last one then kept until its own time."""
        if not proxy or len(proxy) > 255:
            raise BadRequest("a consumer report names its proxy (at most 255 characters)")
        if len(consumers) > MAX_REPORTED:
            raise BadRequest(f"a consumer report lists {len(consumers)} consumers, at most {MAX_REPORTED}")
        if not TTL_MS[0] <= ttl_ms <= TTL_MS[1]:
            raise BadRequest(f"a consumer report's time to live {ttl_ms} ms is outside {TTL_MS[0]}..{TTL_MS[1]} ms")
        groups, size = _grouped(proxy, consumers)
        self.expire(now_ms)
        if proxy not in self._reports and len(self._reports) >= MAX_PROXIES:
            raise TooManyRequests(f"consumers of {MAX_PROXIES} proxies are kept already")
        others = self._bytes - (self._reports[proxy].size if proxy in self._reports else 0)
        if others + size > self._max_bytes:
            raise TooManyRequests(f"consumer reports kept would take {others + size} bytes, at most {self._max_bytes}")
        self._reports[proxy] = _Report(now_ms + ttl_ms, groups, size)
        self._bytes = others + size

    def expire(self, now_ms: int) -> None:
        for proxy in [p for p, r in self._reports.items() if r.until_ms < now_ms]:
            self._bytes -= self._reports.pop(proxy).size

    def of_group(self, group: str, now_ms: int) -> list[Seen]:
        """The consumers of `group` in the reports alive now, by client id and proxy."""
        self.expire(now_ms)
        return self._group(group)

    def every_group(self, now_ms: int, limit: int = EVERY_GROUP_LIMIT) -> tuple[list[Seen], bool]:
        """The first `limit` consumers of every group in the reports alive now, by group, client id and proxy, and
        whether more are kept. Reads the first `limit` + 1 groups only (each has a consumer)."""
        self.expire(now_ms)
        names = set[str]().union(*(r.groups for r in self._reports.values()))
        found: list[Seen] = []
        for group in heapq.nsmallest(limit + 1, names):
            found += self._group(group)
            if len(found) > limit:
                break
        return found[:limit], len(found) > limit

    def _group(self, group: str) -> list[Seen]:
        found = [
            Seen(group, client_id, proxy, last_seen_ms)
            for proxy, report in self._reports.items()
            for client_id, last_seen_ms in zip(*report.groups.get(group, ((), ())), strict=True)
        ]
        return sorted(found, key=lambda s: (s.client_id, s.proxy))
