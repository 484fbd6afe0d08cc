"""The proxy's health checks of its brokers: every broker every interval, and one discovery just added at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from proxy.brokers import GrpcBrokerClient
from proxy.ports import BackgroundTask


class HealthMonitor(BackgroundTask):
    """Checks every broker every `interval` seconds (each check bounded by `timeout`) until closed."""

    def __init__(self, clients: Callable[[], Iterable[GrpcBrokerClient]], *, interval: float, timeout: float) -> None:
        self._clients = clients  # read at every round (brokers discovery adds are also checked at once)
        self._interval = interval
        self._timeout = timeout
        self._checks: set[asyncio.Task[bool]] = set()  # `check_now`'s

    async def check_all(self) -> None:
        await asyncio.gather(*(c.check_health(timeout_s=self._timeout) for c in self._clients()))

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
