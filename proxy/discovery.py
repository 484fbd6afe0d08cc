"""Brokers found in DNS: a SRV name lists them (a Kubernetes headless Service: `_grpc._tcp.popgate-broker`), and
the proxy follows it as brokers are added, move or go, without a restart (docs/PROXY.md, "Broker discovery").

Each SRV target is one broker: its name is the target's first label (a StatefulSet pod's name, the name the
broker itself runs under), its address the target's A record and the SRV port. `Membership` (pure) turns
successive lookups into changes; `SrvLookup` asks DNS (dnspython: a nameserver of the system's or the one given);
`Discovery` repeats the lookup and applies the changes to the pool.

A broker missing from a lookup stays in the pool (down, if its health checks fail) for `forget_s`, so a pod
restarting or a DNS hiccup does not drop it; only then is it retired: out of routing, its receipt handles
answered as a down broker's. A lookup that fails (timeout, no nameserver) changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import dns.asyncresolver
import dns.exception
import dns.name
import dns.resolver

from popgate_contract.validation import parse_host_port
from proxy.ports import BackgroundTask
from proxy.settings import BROKER_NAME, BrokerAddress

log = logging.getLogger(__name__)
ASKED_GAP_S = 1.0  # an asked lookup (`Discovery.ask`) begins at least this long after the one before


@dataclass(frozen=True, slots=True)
class Changes:
    added: list[BrokerAddress] = field(default_factory=list)  # new names, and names back after being retired
    moved: list[BrokerAddress] = field(default_factory=list)  # known names at another address
    retired: list[str] = field(default_factory=list)  # names missing for forget_s

    def __bool__(self) -> bool:
        return bool(self.added or self.moved or self.retired)


class Membership:
    """The brokers a SRV name lists, from one lookup to the next — tests/unit/proxy/test_discovery.py."""

    def __init__(self, *, forget_s: float) -> None:
        self._forget_s = forget_s
        self._known: dict[str, BrokerAddress] = {}
        self._missing_since: dict[str, float] = {}

    @property
    def known(self) -> list[BrokerAddress]:
        return [self._known[name] for name in sorted(self._known)]

    def update(self, found: Iterable[BrokerAddress], *, now: float) -> Changes:
        changes = Changes()
        seen = {address.name: address for address in found}
        for name, address in sorted(seen.items()):
            self._missing_since.pop(name, None)
            before = self._known.get(name)
            if before is None:
                changes.added.append(address)
            elif before != address:
                changes.moved.append(address)
            self._known[name] = address
        for name in sorted(set(self._known) - set(seen)):
            since = self._missing_since.setdefault(name, now)
            if now - since >= self._forget_s:
                del self._known[name], self._missing_since[name]
                changes.retired.append(name)
        return changes


class LookupFailed(Exception):
    """DNS did not answer (timeout, no nameserver reachable): what the name lists is unknown."""


class SrvLookup:
    """One lookup of a SRV name and the A records of its targets, through `server` (HOST:PORT) or the system's
    resolver configuration. A name that does not exist or lists nothing lists no broker."""

    def __init__(self, srv_name: str, *, server: str = "", timeout_s: float = 2.0) -> None:
        self._name = srv_name
        self._timeout_s = timeout_s
        self._resolver = dns.asyncresolver.Resolver(configure=not server)
        if server:
            host, port = parse_host_port(server, what="--broker-dns-server")
            self._resolver.nameservers = [host]
            self._resolver.port = port

    async def __call__(self) -> list[BrokerAddress]:
        srv = await self._records(self._name, "SRV")
        targets = sorted({(record.target, record.port) for record in srv})
        answers = await asyncio.gather(*(self._records(target, "A") for target, _ in targets))
        found: dict[str, BrokerAddress] = {}
        for (target, port), records in zip(targets, answers, strict=True):
            host = target.to_text(omit_final_dot=True)
            name = target.labels[0].decode("ascii", "replace") if target.labels else ""
            addresses = sorted(record.address for record in records)
            if not BROKER_NAME.fullmatch(name) or not addresses:
                # not a broker name (as --broker NAME requires), or no address yet (a pod being scheduled: found
                # by a later lookup)
                continue
            found.setdefault(name, BrokerAddress(name, f"{addresses[0]}:{port}", host_name=host))
        return list(found.values())

    async def _records(self, name: str | dns.name.Name, kind: str) -> list[Any]:
        try:
            answer = await self._resolver.resolve(name, kind, search=True, lifetime=self._timeout_s)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.DNSException as exc:
            raise LookupFailed(f"{kind} {name}: {exc}") from None
        return list(answer)


@dataclass(frozen=True, slots=True)
class PoolEdits:
    """What discovery does to the proxy's brokers (proxy.server wires them to the pool and its clients)."""

    add: Callable[[BrokerAddress], None]  # a client for the address, in place of the name's client if any
    retire: Callable[[str], None]


class Discovery(BackgroundTask):
    """Looks the brokers up every `interval_s` and applies what changed to the pool until closed."""

    def __init__(
        self,
        lookup: Callable[[], Awaitable[list[BrokerAddress]]],
        edits: PoolEdits,
        *,
        interval_s: float,
        forget_s: float,
        clock: Callable[[], float] | None = None,
        asked_gap_s: float = ASKED_GAP_S,
    ) -> None:
        self._lookup = lookup
        self._edits = edits
        self._interval_s = interval_s
        self._asked = asyncio.Event()  # `ask`: look up again now
        self._asked_gap_s = asked_gap_s
        self._began = -asked_gap_s  # when the last lookup began (the loop's time)
        self.membership = Membership(forget_s=forget_s)
        self._clock = clock or asyncio.get_running_loop().time
        self._failing = False
        self.answered = asyncio.Event()  # a lookup has answered (brokers found or none): the proxy may report ready

    def ask(self, name: str = "") -> None:
        """Look up again now, not at the next interval: a receipt handle named a broker not found yet (`name`). One
        lookup at a time, an asked one no sooner than `asked_gap_s` after the last began, however often asked —
        tests/unit/proxy/test_discovery.py::
        test_a_lookup_asked_for_runs_at_once_one_at_a_time_and_no_sooner_than_the_gap_after_the_last."""
        self._asked.set()

    async def refresh(self) -> Changes:
        """One lookup, its changes applied; nothing changes when the lookup fails."""
        self._began = asyncio.get_running_loop().time()
        try:
            found = await self._lookup()
        except LookupFailed as exc:
            if not self._failing:
                log.warning("broker discovery: lookup failed, keeping the brokers known: %s", exc)
            self._failing = True
            return Changes()
        self._failing = False
        self.answered.set()
        changes = self.membership.update(found, now=self._clock())
        for address in changes.added + changes.moved:
            log.info("broker discovery: %s at %s", address.name, address.target)
            self._edits.add(address)
        for name in changes.retired:
            log.warning("broker discovery: %s gone from DNS, retired", name)
            self._edits.retire(name)
        return changes

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(self._asked.wait(), self._interval_s)
            except TimeoutError:
                pass
            else:
                await asyncio.sleep(self._began + self._asked_gap_s - loop.time())
            self._asked.clear()
            try:
                await self.refresh()
            except Exception:  # a bug must not end discovery for good: logged, tried again next interval
                log.exception("broker discovery: lookup round failed")

    async def __aenter__(self) -> Discovery:
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="broker-discovery")
        return self
