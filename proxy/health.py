"""The proxy's health checks of its brokers: every broker every interval, and one discovery just added at once.

A broker whose checks keep timing out on a connection its channel says is up gets a new connection
(`StuckConnections`): a connection that died without a word (no FIN, no RST: a NAT or firewall entry lost, a
blackholed link) is never noticed by its channel, and every check on it would time out until the kernel gives up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from proxy.brokers import GrpcBrokerClient
from proxy.ports import BackgroundTask

STUCK_AFTER = 3  # health checks in a row timing out on a connected channel before a broker's connection is made again
STUCK_AFTER_MOST = 48  # the most that wait grows to, for a broker whose new connections time out too


class StuckConnections:
    """Whether a broker's connection is to be made again, from its health checks' outcomes: `after` in a row timed
    out while the channel said it was connected (a broker that is dead, hung or answering NOT_SERVING fails them
    otherwise: a new connection would not help). Each time again with no check passing between waits twice as many
    checks, at most `most`: a broker too slow for its checks is not reconnected every few seconds —
    tests/unit/proxy/test_stuck_connections.py."""

    def __init__(self, *, after: int = STUCK_AFTER, most: int = STUCK_AFTER_MOST) -> None:
        self._after = after
        self._most = most
        self._run: dict[str, int] = {}  # checks in a row timed out while connected, by broker name
        self._needed: dict[str, int] = {}  # how many make a new connection (grows as they keep coming)

    def checked(self, name: str, *, passed: bool, stuck: bool) -> bool:
        """One health check of broker `name`; True when its connection is to be made again now."""
        if passed:
            self._needed.pop(name, None)
        if not stuck:
            self._run.pop(name, None)
            return False
        run = self._run[name] = self._run.get(name, 0) + 1
        needed = self._needed.get(name, self._after)
        if run < needed:
            return False
        self._run.pop(name)
        self._needed[name] = min(needed * 2, self._most)
        return True


class HealthMonitor(BackgroundTask):
    """Checks every broker every `interval` seconds (each check bounded by `timeout`) until closed, and hands
    `reconnect` each broker whose connection is stuck (`StuckConnections`)."""

    def __init__(
        self,
        clients: Callable[[], Iterable[GrpcBrokerClient]],
        *,
        interval: float,
        timeout: float,
        reconnect: Callable[[GrpcBrokerClient], None] | None = None,
    ) -> None:
        self._clients = clients  # read at every round (brokers discovery adds are also checked at once)
        self._interval = interval
        self._timeout = timeout
        self._reconnect = reconnect
        self._stuck = StuckConnections()
        self._checks: set[asyncio.Task[bool]] = set()  # `check_now`'s

    async def check_all(self) -> None:
        clients = list(self._clients())
        passed = await asyncio.gather(*(c.check_health(timeout_s=self._timeout) for c in clients))
        for client, ok in zip(clients, passed, strict=True):
            stuck = self._stuck.checked(client.name, passed=ok, stuck=client.check_timed_out_connected)
            if stuck and self._reconnect is not None:
                self._reconnect(client)

    def check_now(self, client: GrpcBrokerClient) -> None:
        """Check `client` at once (a broker discovery just added, down until a check passes), not at the next
        round — tests/integration/proxy/test_discovery.py::
        test_a_broker_discovery_adds_is_routed_only_once_its_health_check_passes."""
        task = asyncio.get_running_loop().create_task(client.check_health(timeout_s=self._timeout))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def __aexit__(self, *exc_info: object) -> None:
        for task in self._checks:
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
        await super().__aexit__(*exc_info)

    async def _run(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self._interval)

    async def __aenter__(self) -> HealthMonitor:
        await self.check_all()
        self._task = asyncio.create_task(self._run(), name="broker-health")
        return self
