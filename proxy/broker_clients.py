"""The proxy's broker clients by name, and discovery wired to them (`proxy.server` makes both at start)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

from popgate_process import certs
from proxy.admin import BrokerView
from proxy.brokers import GrpcBrokerClient
from proxy.discovery import Discovery, PoolEdits, SrvLookup
from proxy.metrics import ProxyMetrics
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings, SettingsError

log = logging.getLogger(__name__)


def _broker_ca(settings: Settings) -> bytes:
    try:
        return certs.trusted(Path(settings.broker_tls_ca).read_bytes())
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"--broker-tls-ca {settings.broker_tls_ca}: {exc}") from None


class BrokerClients:
    """The proxy's broker clients by name — the listed brokers, or those discovery finds — and every client it
    made, closed when the proxy stops. A client discovery replaced (its broker moved) or retired is closed once the
    calls it had could have ended (`replaced_grace_s`); a retired one stays in the pool, down and closed, so handles
    naming it resolve and are answered as a down broker's — tests/unit/proxy/test_discovery.py::
    test_a_retired_client_is_closed_after_its_grace_and_its_handles_are_still_answered_as_down."""

    def __init__(self, settings: Settings, metrics: ProxyMetrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self.tls_ca = _broker_ca(settings) if settings.broker_tls_ca else None
        self.current: dict[str, GrpcBrokerClient] = {}
        self._made: set[GrpcBrokerClient] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self.replaced_grace_s = settings.broker_timeout_s + settings.max_long_polling_s
        self.added: Callable[[GrpcBrokerClient], None] | None = None  # told of each client `add` made down
        # Told each time a broker comes up (added, moved, back from down): the proxy announces its groups there.
        self.came_up: Callable[[GrpcBrokerClient], None] | None = None
        self.pool = BrokerPool({})
        for address in settings.brokers:
            self.add(address, up=True)  # listed: checked before the proxy serves

    def add(self, address: BrokerAddress, why: str = "gone from broker discovery", *, up: bool = False) -> None:
        """A client for `address` in place of its name's. Down (out of routing) until a health check passes, which
        `added` runs at once, unless `up` — tests/unit/proxy/test_discovery.py::
        test_a_broker_discovery_adds_is_routed_only_once_a_health_check_passed_which_runs_at_once."""
        settings = self._settings
        client = GrpcBrokerClient(
            address, metrics=self._metrics, token=settings.broker_token, tls_ca=self.tls_ca, up=up
        )
        client.on_up = self._came_up
        if not up and self.added is not None:
            self.added(client)
        self._made.add(client)
        self.current[address.name] = client
        replaced = self.pool.put(client)
        if isinstance(replaced, GrpcBrokerClient):
            replaced.retire(why)  # its calls fail over to the new client
            asyncio.get_running_loop().call_later(self.replaced_grace_s, self._close, replaced)

    def _came_up(self, client: GrpcBrokerClient) -> None:
        if self.came_up is not None:
            self.came_up(client)

    def trust(self, ca: bytes) -> None:
        """Verify brokers against `ca` from now on: every broker's client is made again with it (new connections), and
        the one before ends as when discovery moves a broker."""
        self.tls_ca = ca
        for client in list(self.current.values()):
            self.add(client.address, why="replaced: the broker CA bundle changed", up=client.healthy)

    def reconnect(self, client: GrpcBrokerClient) -> None:
        """A new client (a new connection) for `client`'s broker, its health checks timing out on a connection that
        may have died without a word; the one before ends as when discovery moves a broker —
        tests/integration/proxy/test_silent_link.py."""
        if self.current.get(client.name) is client:
            log.warning(
                "broker %s (%s): health checks time out on its connection: connecting again",
                client.name,
                client.address.target,
            )
            self.add(client.address, why="replaced: its connection stopped answering", up=False)
            self.current[client.name].connect()

    def _close(self, client: GrpcBrokerClient) -> None:
        if client in self._made:
            self._made.discard(client)
            task = asyncio.get_running_loop().create_task(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def retire(self, name: str) -> None:
        self.pool.retire(name)
        client = self.current.pop(name, None)
        if client is not None:
            client.retire()
            asyncio.get_running_loop().call_later(self.replaced_grace_s, self._close, client)

    def views(self) -> list[BrokerView]:
        return [BrokerView(n, c.address.target, c.healthy) for n, c in sorted(self.current.items())]

    async def close(self) -> None:
        await asyncio.gather(*self._closing, *(client.close() for client in self._made), return_exceptions=True)


async def discovery_for(settings: Settings, brokers: BrokerClients, stack: AsyncExitStack) -> Discovery | None:
    if not settings.broker_srv:
        return None
    lookup = SrvLookup(settings.broker_srv, server=settings.broker_dns_server, timeout_s=settings.health_timeout_s * 4)
    edits = PoolEdits(add=brokers.add, retire=brokers.retire)
    interval, forget = settings.broker_dns_interval_s, settings.broker_forget_s
    discovery = Discovery(lookup, edits, interval_s=interval, forget_s=forget)
    brokers.pool.unknown_broker = discovery.ask  # a handle naming a broker not found yet: retriable, looked up now
    return await stack.enter_async_context(discovery)
