"""The adaptive receive (DESIGN §3, `--receive-mode adaptive`, the default): per request, the pure
`proxy.adaptive.AdaptivePolicy` chooses pop with notify or coupled long polling, and that strategy serves it."""

from __future__ import annotations

import asyncio

from proxy.adaptive import AdaptivePolicy
from proxy.ports import Metrics, NoMetrics
from proxy.receive import ReceiveRequest, ReceiveResult, ReceiveStrategy
from proxy.routing import BrokerPool


class AdaptiveStrategy:
    """Per request: pop with notify while the group is quiet, coupled long polling when it is busy."""

    mode = "adaptive"

    def __init__(
        self,
        pool: BrokerPool,
        policy: AdaptivePolicy,
        notify: ReceiveStrategy,
        longpoll: ReceiveStrategy,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self._pool = pool
        self._policy = policy
        self._by_mode = {"notify": notify, "longpoll": longpoll}
        self._metrics = metrics or NoMetrics()

    async def receive(self, request: ReceiveRequest, closing: asyncio.Event) -> ReceiveResult:
        loop = asyncio.get_running_loop()
        decision = self._policy.start(request.group, now=loop.time(), live_brokers=len(self._pool.live()))
        self._metrics.mode_decision(request.group, decision.mode, decision.reason)
        try:
            return await self._by_mode[decision.mode].receive(request, closing)
        finally:
            self._policy.end(request.group, now=loop.time())
