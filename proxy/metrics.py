"""The proxy's Prometheus metrics, in a registry of their own (no process globals)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from proxy.receive.notify import RunStats

MAX_GROUP_LABELS = 1000  # consumer groups with their own label on this proxy; the others share OTHER_GROUPS
OTHER_GROUPS = "_other"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30)


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, max_groups: int = MAX_GROUP_LABELS) -> None:
        self.registry = registry or CollectorRegistry()
        self._max_groups = max_groups
        self._groups: set[str] = set()
        self._rpc = Histogram(
            "popgate_proxy_rpc_duration_seconds",
            "Client RPCs served, by method and v2 status code",
            ["method", "code"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._broker = Counter(
            "popgate_proxy_broker_rpcs",
            "Calls to brokers, by outcome (ok, the error name, or cancelled: unanswered when the proxy dropped it)",
            ["broker", "method", "outcome"],
            registry=self.registry,
        )
        self._receives = Counter(
            "popgate_proxy_receives",
            "ReceiveMessage outcomes: messages, empty, full (overload), behind (no time left to poll: the proxy is "
            "behind), illegal_polling_time, closing (shutdown), cancelled (client gone), error",
            ["group", "mode", "outcome"],
            registry=self.registry,
        )
        self._first_pop_hits = Counter(
            "popgate_proxy_receive_first_pop_hits",
            "Receives whose first Pop found messages at once, without a broker holding it (is_short_polling_hit): "
            "pop with notify's poll-0 first Pop, no notify round needed, or a long-poll Pop answered at once",
            ["group"],
            registry=self.registry,
        )
        self._receive_latency = Histogram(
            "popgate_proxy_receive_latency_seconds",
            "Time from a ReceiveMessage request to its answer",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

        self._mode_latency = Histogram(
            "popgate_proxy_receive_mode_latency_seconds",
            "Time from a ReceiveMessage request to its answer, by strategy and outcome (messages / empty / ...)",
            ["mode", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._long_polls = Counter(
            "popgate_proxy_long_polling_receives",
            "Receives that waited at brokers (is_long_polling): a long-poll Pop a broker held (RocketMQ's "
            "suspended request), or a pop-with-notify run whose first Pop was empty and that asked a broker to hold "
            "it (not only a poll-0 last look)",
            ["group"],
            registry=self.registry,
        )
        self._moved = Counter(
            "popgate_proxy_long_polls_moved",
            "Held long-poll Pops moved to a broker that had a message nobody of the group waited for there",
            ["group"],
            registry=self.registry,
        )
        self._not_read = Counter(
            "popgate_proxy_answers_not_read",
            "Answers with messages their clients did not read within max_answer_write_s: the messages were given back",
            ["group"],
            registry=self.registry,
        )
        self._notify_runs = Counter(
            "popgate_proxy_notify_runs",
            "Receives served by pop with notify (their first Pop included)",
            ["group"],
            registry=self.registry,
        )
        self._notifications = Counter(
            "popgate_proxy_notifications",
            "Notifications sent to brokers by pop with notify, by outcome: has_message, empty (nothing for the "
            "group: held until the poll ended, or a poll-0 last look answered so), full (broker polling_full), "
            "unanswered (cancelled before the poll ended: answered elsewhere, deadline, client gone; or failed)",
            ["group", "outcome"],
            registry=self.registry,
        )
        self._notify_pops = Counter(
            "popgate_proxy_notify_pops",
            "Pops made by pop with notify: first (poll 0 before notifying), consume (after has_message), "
            "lost (a consume Pop found nothing: another consumer won the race), handoff (adaptive: after a lost "
            "race in a busy group, the rest of the wait is a coupled long poll), held (one live broker: a Pop "
            "held by it instead of a Notification)",
            ["group", "kind"],
            registry=self.registry,
        )
        self._decisions = Counter(
            "popgate_proxy_receive_mode_decisions",
            "Adaptive mode: the strategy chosen per receive and why (quiet, rate, concurrency)",
            ["group", "mode", "reason"],
            registry=self.registry,
        )

        self._renewals = Counter(
            "popgate_proxy_renewals",
            "auto_renew handles sent to their broker for renewal, by outcome: ok, stale (acked elsewhere or "
            "redelivered: no longer renewed), failed (the broker call failed: tried again a period later)",
            ["outcome"],
            registry=self.registry,
        )
        self._renewal_untracked = Counter(
            "popgate_proxy_renewal_untracked",
            "auto_renew handles this proxy does not renew, by reason: no_client_id (the receive named no client: "
            "nobody to watch), client_limit, total_limit (over the bounds on handles tracked)",
            ["reason"],
            registry=self.registry,
        )
        self._renewal_ended = Counter(
            "popgate_proxy_renewal_ended",
            "auto_renew handles no longer renewed, by reason: settled (acked, changed or dead-lettered through this "
            "proxy), stale, max_time (renewed for renew_max_s), client_gone",
            ["reason"],
            registry=self.registry,
        )
        self._renewal_handles = Gauge(
            "popgate_proxy_renewal_handles",
            "auto_renew handles being renewed by this proxy now",
            registry=self.registry,
        )

    def renewals(self, outcome: str, count: int) -> None:
        self._renewals.labels(outcome).inc(count)

    def renewal_untracked(self, reason: str, count: int) -> None:
        self._renewal_untracked.labels(reason).inc(count)

    def renewal_ended(self, reason: str, count: int) -> None:
        self._renewal_ended.labels(reason).inc(count)

    def watch_renewals(self, tracked: Callable[[], int]) -> None:
        self._renewal_handles.set_function(tracked)

    def watch_brokers(self, brokers: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        """`popgate_proxy_broker_up{broker}`: 1 while this proxy's health checks see the broker up, 0 while down,
        for every broker it routes to (discovery's too; a retired one is absent)."""
        self.registry.register(_BrokerHealth(brokers))

    def rpc(self, method: str, code: str, seconds: float) -> None:
        self._rpc.labels(method, code).observe(seconds)

    def broker_rpc(self, broker: str, method: str, outcome: str) -> None:
        self._broker.labels(broker, method, outcome).inc()

    def _group(self, group: str) -> str:
        """The group's label: its name for the first `max_groups` groups seen, OTHER_GROUPS after that —
        any client can name a new group per request, and every label set is kept for the process's life."""
        if group in self._groups:
            return group
        if len(self._groups) < self._max_groups:
            self._groups.add(group)
            return group
        return OTHER_GROUPS

    def receive(self, group: str, mode: str, outcome: str, seconds: float) -> None:
        self._receives.labels(self._group(group), mode, outcome).inc()
        self._receive_latency.observe(seconds)
        self._mode_latency.labels(mode, outcome).observe(seconds)

    def long_poll(self, group: str) -> None:
        self._long_polls.labels(self._group(group)).inc()

    def first_pop_hit(self, group: str) -> None:
        self._first_pop_hits.labels(self._group(group)).inc()

    def pop_moved(self, group: str) -> None:
        self._moved.labels(self._group(group)).inc()

    def answer_not_read(self, group: str) -> None:
        self._not_read.labels(self._group(group)).inc()

    def notify_run(self, group: str, stats: RunStats) -> None:
        group = self._group(group)
        self._notify_runs.labels(group).inc()
        if stats.waited:
            self.long_poll(group)
        if stats.first_pop_hit:
            self.first_pop_hit(group)
        answered = stats.notified_has_message + stats.notified_empty + stats.notified_full
        for outcome, count in (
            ("has_message", stats.notified_has_message),
            ("empty", stats.notified_empty),
            ("full", stats.notified_full),
            ("unanswered", stats.notifications - answered),
        ):
            if count:
                self._notifications.labels(group, outcome).inc(count)
        consume = stats.pops - 1 if stats.pops else 0
        kinds = (
            ("first", min(stats.pops, 1)),
            ("consume", consume - stats.handoff - stats.held_pop),
            ("lost", stats.lost_races),
            ("handoff", int(stats.handoff)),
            ("held", int(stats.held_pop)),
        )
        for kind, count in kinds:
            if count:
                self._notify_pops.labels(group, kind).inc(count)

    def mode_decision(self, group: str, mode: str, reason: str) -> None:
        self._decisions.labels(self._group(group), mode, reason).inc()


class _BrokerHealth(Collector):
    def __init__(self, brokers: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        self._brokers = brokers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "popgate_proxy_broker_up",
            "1 while this proxy's health checks see the broker up, 0 while down",
            labels=["broker"],
        )
        for name, up in self._brokers():
            family.add_metric([name], 1.0 if up else 0.0)
        yield family
