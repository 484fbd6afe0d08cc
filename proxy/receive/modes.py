"""The receive mode the settings name (`--receive-mode`), built over the broker pool: the one `ReceiveStrategy`
the core is given (docs/RECEIVE.md)."""

from __future__ import annotations

from proxy.ports import Metrics
from proxy.receive.adaptive import AdaptivePolicy, AdaptiveSettings
from proxy.receive.adaptive_driver import AdaptiveStrategy, busy_groups
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.notify_driver import NotifyStrategy
from proxy.receive.seam import ReceiveStrategy
from proxy.routing import BrokerPool
from proxy.settings import Settings, SettingsError


def make_strategy(settings: Settings, pool: BrokerPool, metrics: Metrics | None = None) -> ReceiveStrategy:
    # Adaptive long polls cover every broker (no false empty is its promise); plain longpoll is the baseline.
    cover = settings.receive_mode == "adaptive"
    longpoll = LongPollStrategy(pool, broker_timeout_s=settings.broker_timeout_s, metrics=metrics, cover=cover)
    if settings.receive_mode == "longpoll":
        return longpoll
    if settings.receive_mode == "notify":
        return NotifyStrategy(pool, broker_timeout_s=settings.broker_timeout_s, metrics=metrics)
    if settings.receive_mode == "adaptive":
        policy = AdaptivePolicy(
            AdaptiveSettings(
                window_s=settings.adaptive_window_s,
                rate_threshold=settings.adaptive_rate_threshold,
                concurrency_per_broker=settings.adaptive_concurrency_per_broker,
                proxies=settings.adaptive_proxies,
            )
        )
        notify = NotifyStrategy(
            pool,
            broker_timeout_s=settings.broker_timeout_s,
            metrics=metrics,
            busy=busy_groups(policy, pool),
            cover=longpoll,
        )
        return AdaptiveStrategy(pool, policy, notify, longpoll, metrics=metrics)
    raise SettingsError(f"receive mode {settings.receive_mode!r} is not implemented")
