"""The adaptive receive (docs/ARCHITECTURE.md §3, `--receive-mode adaptive`, the default): per request, the pure
`proxy.receive.adaptive.AdaptivePolicy` chooses pop with notify or coupled long polling, and that strategy serves
it; a notify run that loses a race while its group is busy hands off to long polling (`busy_groups`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from proxy.ports import Metrics, NoMetrics
from proxy.receive.adaptive import AdaptivePolicy
from proxy.receive.seam import ReceiveRequest, ReceiveResult, ServesForPolicy
from proxy.routing import BrokerPool


class AdaptiveStrategy:
    """Per request: pop with notify while the group is quiet, coupled long polling when it is busy."""

    mode = "adaptive"

    def __init__(
        self,
        pool: BrokerPool,
        policy: AdaptivePolicy,
        notify: ServesForPolicy,
        longpoll: ServesForPolicy,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self._pool = pool
        self._policy = policy
        self._by_mode = {"notify": notify, "longpoll": longpoll}
        self._metrics = metrics or NoMetrics()

    def broker_up(self, broker: str) -> None:
        for strategy in self._by_mode.values():
            strategy.broker_up(broker)

    def receive(self, request: ReceiveRequest, closing: asyncio.Event) -> Awaitable[ReceiveResult]:
        """The chosen strategy's receive, which tells the policy when it ends: no coroutine of this one stays in a
        held receive — tests/unit/proxy/receive/test_adaptive_driver.py::
        test_a_held_adaptive_long_poll_is_one_strategy_coroutine_and_every_receive_ends_at_the_policy."""
        now = asyncio.get_running_loop().time()
        decision = self._policy.start(request.group, now=now, live_brokers=len(self._pool.live()))
        self._metrics.mode_decision(request.group, decision.mode, decision.reason, request=request)
        return self._by_mode[decision.mode].receive(request, closing, policy=self._policy)


def busy_groups(policy: AdaptivePolicy, pool: BrokerPool) -> Callable[[str], bool]:
    """`busy(group)` for `NotifyStrategy`: whether the policy sees the group busy now over the live brokers, so
    that a run of it that lost a race hands off to long polling."""

    def busy(group: str) -> bool:
        now = asyncio.get_running_loop().time()
        return policy.busy(group, now=now, live_brokers=len(pool.live()))

    return busy
