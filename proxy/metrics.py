"""The proxy's Prometheus metrics, in a registry of their own (no process globals)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from popgate_process.certs import CertificateMetrics
from popgate_process.histogram import BatchHistogram
from proxy.metric_labels import MAX_GROUP_LABELS, MAX_TOPIC_GROUP_LABELS, SERVED, GroupLabels

if TYPE_CHECKING:
    from popgate_pb import broker_pb2 as bpb

    from popgate_contract.errors import DomainError
    from proxy.receive.notify import RunStats

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30)
# Stored (or due) -> delivered: from a consumer keeping up (milliseconds) to a backlog hours old.
DELIVERY_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
M = TypeVar("M", bound=MetricWrapperBase)


class _Children(Generic[M]):
    """A labelled metric's children by their label values, each looked up with `labels()` once, when first used
    (so a series appears when it did before: at its first count). They live as long as the metric, which removes
    none, so a kept child is the one `labels()` would return."""

    __slots__ = ("_metric", "_children")

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


def _counters(registry: CollectorRegistry, name: str, doc: str, labels: list[str]) -> _Children[Counter]:
    return _Children(Counter(name, doc, labels, registry=registry))


def _histograms(registry: CollectorRegistry, name: str, doc: str, labels: list[str]) -> _Children[Histogram]:
    return _Children(Histogram(name, doc, labels, buckets=_LATENCY_BUCKETS, registry=registry))


class ProxyMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        max_groups: int = MAX_GROUP_LABELS,
        max_topic_groups: int = MAX_TOPIC_GROUP_LABELS,
    ) -> None:
        """The families are registered in this order, which is their order on /metrics."""
        self.registry = registry = registry or CollectorRegistry()
        self._labels = GroupLabels(max_groups, max_topic_groups)
        self._named = self._labels.named
        self.tls = CertificateMetrics(registry, "proxy")
        self._rpc = _histograms(
            registry,
            "popgate_proxy_rpc_duration_seconds",
            "Client RPCs served, by method and v2 status code",
            ["method", "code"],
        )
        self._broker = _counters(
            registry,
            "popgate_proxy_broker_rpcs",
            "Calls to brokers, by outcome (ok, the error name, or cancelled: unanswered when the proxy dropped it)",
            ["broker", "method", "outcome"],
        )
        self._add_receive_metrics(registry)
        self._add_notify_metrics(registry)
        self._deliveries = _DeliveryMetrics(registry)
        self._add_renewal_metrics(registry)

    def _add_receive_metrics(self, registry: CollectorRegistry) -> None:
        self._receives = _counters(
            registry,
            "popgate_proxy_receives",
            "ReceiveMessage outcomes: messages, empty, full (overload), behind (no time left to poll: the proxy is "
            "behind), illegal_polling_time, closing (shutdown), cancelled (client gone), error",
            ["group", "mode", "outcome"],
        )
        self._first_pop_hits = _counters(
            registry,
            "popgate_proxy_receive_first_pop_hits",
            "Receives whose first Pop found messages at once, without a broker holding it (is_short_polling_hit): "
            "pop with notify's poll-0 first Pop, no notify round needed, or a long-poll Pop answered at once",
            ["group"],
        )
        self._receive_latency = Histogram(
            "popgate_proxy_receive_latency_seconds",
            "Time from a ReceiveMessage request to its answer",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._mode_latency = _histograms(
            registry,
            "popgate_proxy_receive_mode_latency_seconds",
            "Time from a ReceiveMessage request to its answer, by strategy and outcome (messages / empty / ...)",
            ["mode", "outcome"],
        )
        self._long_polls = _counters(
            registry,
            "popgate_proxy_long_polling_receives",
            "Receives that waited at brokers (is_long_polling): a long-poll Pop a broker held (RocketMQ's "
            "suspended request), or a pop-with-notify run whose first Pop was empty and that asked a broker to "
            "hold it (not only a poll-0 last look)",
            ["group"],
        )
        self._moved = _counters(
            registry,
            "popgate_proxy_long_polls_moved",
            "Held long-poll Pops moved to a broker that had a message nobody of the group waited for there",
            ["group"],
        )
        self._not_read = _counters(
            registry,
            "popgate_proxy_answers_not_read",
            "Answers with messages their clients did not read within max_answer_write_s: the messages were given back",
            ["group"],
        )

    def _add_notify_metrics(self, registry: CollectorRegistry) -> None:
        self._notify_runs = _counters(
            registry,
            "popgate_proxy_notify_runs",
            "Receives served by pop with notify (their first Pop included)",
            ["group"],
        )
        self._notifications = _counters(
            registry,
            "popgate_proxy_notifications",
            "Notifications sent to brokers by pop with notify, by outcome: has_message, empty (nothing for the "
            "group: held until the poll ended, or a poll-0 last look answered so), full (broker polling_full), "
            "unanswered (cancelled before the poll ended: answered elsewhere, deadline, client gone; or failed)",
            ["group", "outcome"],
        )
        self._notify_pops = _counters(
            registry,
            "popgate_proxy_notify_pops",
            "Pops made by pop with notify: first (poll 0 before notifying), consume (after has_message), "
            "lost (a consume Pop found nothing: another consumer won the race), handoff (adaptive: after a lost "
            "race in a busy group, the rest of the wait is a coupled long poll), held (one live broker: a Pop "
            "held by it instead of a Notification)",
            ["group", "kind"],
        )
        self._decisions = _counters(
            registry,
            "popgate_proxy_receive_mode_decisions",
            "Adaptive mode: the strategy chosen per receive and why (quiet, rate, concurrency)",
            ["group", "mode", "reason"],
        )

    def _add_renewal_metrics(self, registry: CollectorRegistry) -> None:
        self._renewals = _counters(
            registry,
            "popgate_proxy_renewals",
            "auto_renew handles sent to their broker for renewal, by outcome: ok, stale (acked elsewhere or "
            "redelivered: no longer renewed), failed (the broker call failed: tried again a period later)",
            ["outcome"],
        )
        self._renewal_untracked = _counters(
            registry,
            "popgate_proxy_renewal_untracked",
            "auto_renew handles this proxy does not renew, by reason: no_client_id (the receive named no client: "
            "nobody to watch), client_limit, total_limit (over the bounds on handles tracked)",
            ["reason"],
        )
        self._renewal_ended = _counters(
            registry,
            "popgate_proxy_renewal_ended",
            "auto_renew handles no longer renewed, by reason: settled (acked, changed or dead-lettered through "
            "this proxy), stale, max_time (renewed for renew_max_s), client_gone",
            ["reason"],
        )
        self._renewal_handles = Gauge(
            "popgate_proxy_renewal_handles", "auto_renew handles being renewed by this proxy now", registry=registry
        )

    def renewals(self, outcome: str, count: int) -> None:
        self._renewals(outcome).inc(count)

    def renewal_untracked(self, reason: str, count: int) -> None:
        self._renewal_untracked(reason).inc(count)

    def renewal_ended(self, reason: str, count: int) -> None:
        self._renewal_ended(reason).inc(count)

    def watch_renewals(self, tracked: Callable[[], int]) -> None:
        self._renewal_handles.set_function(tracked)

    def watch_brokers(self, brokers: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        """`popgate_proxy_broker_up{broker}`: 1 while this proxy's health checks see the broker up, 0 while down,
        for every broker it routes to (discovery's too; a retired one is absent)."""
        self.registry.register(_BrokerHealth(brokers))

    def rpc(self, method: str, code: str, seconds: float) -> None:
        self._rpc(method, code).observe(seconds)

    def broker_rpc(self, broker: str, method: str, outcome: str) -> None:
        self._broker(broker, method, outcome).inc()

    def _group(self, group: str, served: bool = True, request: object = None) -> str:
        """The group's label (`GroupLabels`): its name once a broker served one of its requests (`served`); a
        receive's end (`request`) counts its kept mode decision."""
        if group in self._named:
            return group
        label, decisions = self._labels.group(group, served, request)
        for mode, reason in decisions:
            self._decisions(label, mode, reason).inc()
        return label

    def receive(self, group: str, mode: str, outcome: str, seconds: float, *, request: object = None) -> None:
        self._receives(self._group(group, outcome in SERVED, request), mode, outcome).inc()
        self._receive_latency.observe(seconds)
        self._mode_latency(mode, outcome).observe(seconds)

    def long_poll(self, group: str) -> None:
        self._long_polls(self._group(group)).inc()

    def first_pop_hit(self, group: str) -> None:
        self._first_pop_hits(self._group(group)).inc()

    def pop_moved(self, group: str) -> None:
        self._moved(self._group(group)).inc()

    def answer_not_read(self, group: str) -> None:
        self._not_read(self._group(group)).inc()

    def notify_run(self, group: str, stats: RunStats, outcome: str) -> None:
        """A run that ended with `outcome` (a receive's: SERVED or not)."""
        group = self._group(group, outcome in SERVED)
        self._notify_runs(group).inc()
        if stats.waited:
            self._long_polls(group).inc()
        if stats.first_pop_hit:
            self._first_pop_hits(group).inc()
        answered = stats.notified_has_message + stats.notified_empty + stats.notified_full
        for outcome, count in (
            ("has_message", stats.notified_has_message),
            ("empty", stats.notified_empty),
            ("full", stats.notified_full),
            ("unanswered", stats.notifications - answered),
        ):
            if count:
                self._notifications(group, outcome).inc(count)
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
                self._notify_pops(group, kind).inc(count)

    def mode_decision(self, group: str, mode: str, reason: str, *, request: object) -> None:
        """Made before the receive of `request` is served: for a group without a label yet, counted when that
        receive ends (`receive` with the same request), under the label its outcome gives."""
        if not self._labels.defer(group, request, (mode, reason)):
            self._decisions(self._group(group, False), mode, reason).inc()

    def _topic_group(self, topic: str, group: str, served: bool = True) -> tuple[str, str]:
        """Labels of a (topic, group) pair: the group's label and the topic's name for the first pairs a broker
        served — tests/unit/proxy/test_delivery_metrics.py::test_pairs_beyond_the_label_limit_share_the_other_topic."""
        return self._labels.pair(topic, self._group(group, served), served)

    def delivered(
        self,
        topic: str,
        group: str,
        messages: Sequence[bpb.PoppedMessage],
        now_ms: int,
        *,
        firsts: Sequence[int] | None = None,
        body_bytes: int | None = None,
    ) -> None:
        """`messages` of one answer, all written to their client (its OK status too) at `now_ms` (wall clock); their
        `first_since_ms` and body bytes, when the caller read them already (proxy.v2.receive, as it made frames)."""
        if firsts is None:
            firsts = first_since_ms(messages)
        if body_bytes is None:
            body_bytes = sum(len(popped.stored.message.body) for popped in messages)
        self._deliveries.count(*self._topic_group(topic, group), len(messages), body_bytes, firsts, now_ms)

    def acked(self, topic: str, group: str, outcome: Sequence[DomainError | None]) -> None:
        """One AckMessage's entries, each acked (None) or refused with its error; one acked gives the pair labels."""
        self._settled(self._deliveries.acks, topic, group, outcome)

    def changed(self, topic: str, group: str, outcome: Sequence[DomainError | None]) -> None:
        """The entries of one ChangeInvisibleDuration or ChangeInvisibleMany, as `acked` —
        tests/unit/proxy/test_change_many.py::test_changes_are_counted_by_outcome."""
        self._settled(self._deliveries.changes, topic, group, outcome)

    def _settled(
        self, counter: _Children[Counter], topic: str, group: str, outcome: Sequence[DomainError | None]
    ) -> None:
        done = sum(1 for error in outcome if error is None)
        labels = self._topic_group(topic, group, done > 0)
        if done:
            counter(*labels, "ok").inc(done)
        for error in outcome:
            if error is not None:
                counter(*labels, error.name).inc()


class _DeliveryMetrics:
    """What clients got: messages and bytes written to them per topic and group, first deliveries apart from
    redeliveries, how long a message waited from its store to its first delivery, and the acks."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.messages = _Children(
            Counter(
                "popgate_proxy_messages_delivered",
                "Messages written to consumers in answers they read whole, by delivery: first (delivery attempt 1) "
                "or redelivery (attempt > 1)",
                ["topic", "group", "delivery"],
                registry=registry,
            )
        )
        self.bytes = _Children(
            Counter(
                "popgate_proxy_delivered_bytes",
                "Message body bytes written to consumers in answers they read whole",
                ["topic", "group"],
                registry=registry,
            )
        )
        self.latency = BatchHistogram(
            "popgate_proxy_first_delivery_latency_seconds",
            "From a message's store at its broker (its delivery time, for a delayed message) to its first delivery "
            "to a consumer (broker and proxy clocks; < 0 counts as 0)",
            ("topic", "group"),
            DELIVERY_LATENCY_BUCKETS,
        )
        registry.register(self.latency)
        self.acks = _Children(
            Counter(
                "popgate_proxy_acks",
                "AckMessage entries through this proxy, by outcome: ok, or the error's name "
                "(InvalidReceiptHandle, ...)",
                ["topic", "group", "outcome"],
                registry=registry,
            )
        )
        self.changes = _Children(
            Counter(
                "popgate_proxy_invisible_changes",
                "ChangeInvisibleDuration and ChangeInvisibleMany entries through this proxy (nacks, a message's "
                "invisible time extended), by outcome as popgate_proxy_acks",
                ["topic", "group", "outcome"],
                registry=registry,
            )
        )

    def count(self, topic: str, group: str, messages: int, size: int, firsts: Sequence[int], now_ms: int) -> None:
        """An answer of `messages` messages of `size` body bytes, the first deliveries among them waiting since
        `firsts` (`first_since_ms`)."""
        self.latency.observe((topic, group), [(now_ms - since) / 1000 if now_ms > since else 0.0 for since in firsts])
        first = len(firsts)
        if first:
            self.messages(topic, group, "first").inc(first)
        if messages > first:
            self.messages(topic, group, "redelivery").inc(messages - first)
        self.bytes(topic, group).inc(size)


def first_since_ms(messages: Iterable[bpb.PoppedMessage]) -> list[int]:
    """Since when each first delivery (attempt <= 1) among `messages` waited for it, in order: its store time, or its
    delivery time for a delayed message (ms since the epoch). proxy.v2.convert.client_items gathers the same while
    splicing — tests/unit/proxy/test_splice.py::
    test_the_byte_path_and_the_object_path_gather_the_same_first_deliveries."""
    out = []
    for popped in messages:
        if popped.delivery_attempt <= 1:
            stored = popped.stored
            since, due = stored.store_ms, stored.message.deliver_at_ms
            out.append(due if due > since else since)
    return out


def counting(metrics: object) -> ProxyMetrics | None:
    """`metrics` when it is a ProxyMetrics (None for anything else, as tests' NoMetrics): the v2 edge counts
    deliveries and acks in the proxy core's `metrics`."""
    return metrics if isinstance(metrics, ProxyMetrics) else None


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
