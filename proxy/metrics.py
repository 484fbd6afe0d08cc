"""The proxy's Prometheus metrics, in a registry of their own (no process globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30)


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._rpc = Histogram(
            "popgate_proxy_rpc_duration_seconds",
            "Client RPCs served, by method and v2 status code",
            ["method", "code"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._broker = Counter(
            "popgate_proxy_broker_rpcs",
            "Calls to brokers, by outcome (ok or the error name)",
            ["broker", "method", "outcome"],
            registry=self.registry,
        )
        self._receives = Counter(
            "popgate_proxy_receives",
            "ReceiveMessage outcomes: messages, empty, full (overload), closing (shutdown), error",
            ["group", "mode", "outcome"],
            registry=self.registry,
        )
        self._first_pop_hits = Counter(
            "popgate_proxy_receive_first_pop_hits",
            "Receives whose first Pop (poll 0) found messages, no notify round needed (is_short_polling_hit); "
            "the longpoll mode makes no poll-0 Pop and never counts here",
            ["group"],
            registry=self.registry,
        )
        self._receive_latency = Histogram(
            "popgate_proxy_receive_latency_seconds",
            "Time from a ReceiveMessage request to its answer",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def rpc(self, method: str, code: str, seconds: float) -> None:
        self._rpc.labels(method, code).observe(seconds)

    def broker_rpc(self, broker: str, method: str, outcome: str) -> None:
        self._broker.labels(broker, method, outcome).inc()

    def first_pop_hit(self, group: str) -> None:
        self._first_pop_hits.labels(group).inc()

    def receive(self, group: str, mode: str, outcome: str, seconds: float) -> None:
        self._receives.labels(group, mode, outcome).inc()
        self._receive_latency.observe(seconds)
