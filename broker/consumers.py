"""The live consumers proxies report (pure, in memory): what `popgate consumers` lists from any proxy.

Each proxy knows only the clients it serves, so every proxy sends every broker its whole list every few seconds
(`ReportConsumers`, as RocketMQ clients heartbeat to brokers). A report replaces that proxy's previous one, and a
proxy that stops reporting is forgotten once its report's time to live passes, so any broker answers for every
proxy alive. Bounded: MAX_PROXIES reports of at most MAX_REPORTED consumers each; nothing is stored (a broker
restart forgets them until the next reports, seconds later) — tests/unit/broker/test_consumers.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from popgate_contract.errors import BadRequest, TooManyRequests

MAX_PROXIES = 1_000
MAX_REPORTED = 10_000
TTL_MS = (1_000, 600_000)  # the range of a report's time to live


@dataclass(frozen=True, slots=True)
class Seen:
    group: str
    client_id: str
    proxy: str
    last_seen_ms: int


class ConsumerRegistry:
    def __init__(self) -> None:
        self._reports: dict[str, tuple[int, list[Seen]]] = {}  # proxy -> (forgotten after, its consumers)

    def report(self, proxy: str, consumers: list[Seen], ttl_ms: int, now_ms: int) -> None:
        """`proxy`'s whole list, replacing its last one; kept `ttl_ms`."""
        if not proxy or len(proxy) > 255:
            raise BadRequest("a consumer report names its proxy (at most 255 characters)")
        if len(consumers) > MAX_REPORTED:
            raise BadRequest(f"a consumer report lists {len(consumers)} consumers, at most {MAX_REPORTED}")
        if not TTL_MS[0] <= ttl_ms <= TTL_MS[1]:
            raise BadRequest(f"a consumer report's time to live {ttl_ms} ms is outside {TTL_MS[0]}..{TTL_MS[1]} ms")
        self.expire(now_ms)
        if proxy not in self._reports and len(self._reports) >= MAX_PROXIES:
            raise TooManyRequests(f"consumers of {MAX_PROXIES} proxies are kept already")
        self._reports[proxy] = (now_ms + ttl_ms, [Seen(c.group, c.client_id, proxy, c.last_seen_ms) for c in consumers])

    def expire(self, now_ms: int) -> None:
        for proxy in [p for p, (until, _) in self._reports.items() if until < now_ms]:
            del self._reports[proxy]

    def of_group(self, group: str, now_ms: int) -> list[Seen]:
        """The consumers of `group` (every group when empty) in the reports alive now, by group and client id."""
        self.expire(now_ms)
        found = [s for _, seen in self._reports.values() for s in seen if not group or s.group == group]
        return sorted(found, key=lambda s: (s.group, s.client_id, s.proxy))
