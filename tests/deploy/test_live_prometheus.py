"""LIVE: under traffic through the proxy, every dashboard panel has data and a stopped broker's lag is carried."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from .live_cluster import GROUP, TOPIC, Cluster, Process, Prometheus, http_get, wait_for
from .live_traffic import ProxyClient, Received
from .test_prometheus import dashboard_exprs

pytestmark = [pytest.mark.live_cluster, pytest.mark.slow]


ROUND = 8  # messages per round, one SendMessage each: spread over both brokers


def receive_at_least(client: ProxyClient, count: int) -> list[Received]:
    """Receive through the proxy until `count` messages came (more may: earlier ones left ready)."""
    got: list[Received] = []

    def enough() -> bool:
        got.extend(client.receive(TOPIC, GROUP, poll_s=0.5))
        return len(got) >= count

    wait_for(f"{count} messages received through the proxy", enough, 30)
    return got


def sample_value(prometheus: Prometheus, promql: str) -> float:
    result = prometheus.query(promql) or []
    return float(result[0]["value"][1]) if result else 0.0


@pytest.fixture(scope="module")
def consumed(cluster: Cluster, prometheus: Prometheus) -> None:
    """Two rounds of send, receive and ack through the proxy, the second once Prometheus has scraped the first, so
    that every counter the dashboard rates grew between two scrapes; then one dead letter of GROUP."""
    acked = 0
    total = f'sum(popgate_proxy_acks_total{{topic="{TOPIC}", group="{GROUP}", outcome="ok"}})'
    with ProxyClient(cluster.proxy_endpoint) as client:
        for round_number in (1, 2):
            for _ in range(ROUND):
                client.send(TOPIC, 1)
            got = receive_at_least(client, ROUND)
            client.ack(TOPIC, GROUP, got)
            acked += len(got)
            wait_for(
                f"round {round_number}'s {acked} acks to be scraped",
                lambda n=acked: sample_value(prometheus, total) >= n,
                20,
            )
        client.send(TOPIC, 1)
        client.dead_letter(TOPIC, GROUP, receive_at_least(client, 1)[0])


def finite_samples(result: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [r for r in result or [] if r["value"][1] not in ("NaN", "+Inf", "-Inf")]


@pytest.mark.parametrize("selected", ["one topic and group", "All"])
def test_every_dashboard_panel_returns_data(prometheus: Prometheus, consumed: None, selected: str) -> None:
    """Each query of each panel, as Grafana sends it with the test's topic and group chosen, or with "All",
    returns at least one finite value from the live cluster."""
    values = {"$topic": TOPIC, "$group": GROUP} if selected != "All" else {"$topic": ".*", "$group": ".*"}
    values["$__rate_interval"] = "2m"  # since the start of this Prometheus: both rounds of traffic are in it
    empty = []
    for title, expr in dashboard_exprs():
        promql = expr
        for variable, value in values.items():
            promql = promql.replace(variable, value)
        try:
            wait_for(f"{title}: {promql}", lambda q=promql: finite_samples(prometheus.query(q)), 10)
        except pytest.fail.Exception:
            empty.append(f"{title}: {promql}")
    assert empty == [], "queries without data:\n" + "\n".join(empty)


def broker_pid(cluster: Cluster, name: str) -> int:
    """The pid of `popgate up`'s broker child `name` (`python -m broker --name NAME ...`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == cluster.pid and b"broker" in argv and argv[argv.index(b"--name") + 1 :][:1] == [name.encode()]:
            return int(entry.name)
    pytest.fail(f"no broker {name} among the children of `popgate up` ({cluster.pid})", pytrace=False)


def broker_lag(broker: Process) -> float:
    """The broker's own lag of TOPIC/GROUP, from its /metrics."""
    text = wait_for(f"/metrics of {broker.name}", lambda: http_get(f"http://{broker.metrics}/metrics"), 10)
    prefix = f'popgate_broker_consumer_lag_messages{{group="{GROUP}",topic="{TOPIC}"}} '
    return sum(float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix))


def test_a_stopped_broker_keeps_its_lag_in_the_sums_and_is_seen_down(
    cluster: Cluster, prometheus: Prometheus, consumed: None
) -> None:
    """SIGSTOP one broker: Prometheus can no longer scrape it, yet the summed lag the lag alerts read does not dip
    (its last value is carried), the proxy reports it down and PopgateBrokerDown is pending. Runs last: the
    broker is continued at the end."""
    with ProxyClient(cluster.proxy_endpoint) as client:
        for _ in range(4):  # left unconsumed, on both brokers
            client.send(TOPIC, 1)
    stopped = cluster.brokers[-1].name
    lag = f'popgate:consumer_lag_messages:sum{{topic="{TOPIC}", group="{GROUP}"}}'
    live = f'sum(popgate_broker_consumer_lag_messages{{topic="{TOPIC}", group="{GROUP}"}})'
    truth = {b.name: broker_lag(b) for b in cluster.brokers}  # nothing consumes any more: it stays so
    assert truth[stopped] > 0, truth
    before = sum(truth.values())

    # Every broker's last scrape and the record caught up with them (what is carried is the last scrape).
    def caught_up() -> bool:
        for name, value in truth.items():
            own = f'popgate_broker_consumer_lag_messages{{topic="{TOPIC}", group="{GROUP}", process="{name}"}}'
            if sample_value(prometheus, own) != value:
                return False
        return sample_value(prometheus, lag) == before

    wait_for("Prometheus to have every broker's lag, and the record their sum", caught_up, 20)
    summed_since = time.time()
    pid = broker_pid(cluster, stopped)
    os.kill(pid, signal.SIGSTOP)
    try:
        carried = f'popgate:consumer_lag_brokers_carried:count{{topic="{TOPIC}", group="{GROUP}"}}'
        wait_for(f"{stopped}'s lag to be carried", lambda: sample_value(prometheus, carried) == 1, 20)
        assert sample_value(prometheus, live) < before  # what a plain sum would show now
        since = f"{max(1, int(time.time() - summed_since))}s"  # the evaluations since, the stop in the middle
        assert sample_value(prometheus, f"min_over_time({lag}[{since}])") == before  # never dipped
        down = f'popgate_proxy_broker_up{{broker="{stopped}"}} == 0'
        wait_for(f"the proxy to see {stopped} down", lambda: prometheus.query(down), 20)
        pending = f'ALERTS{{alertname="PopgateBrokerDown", broker="{stopped}"}}'
        wait_for("PopgateBrokerDown to be pending", lambda: prometheus.query(pending), 20)
    finally:
        os.kill(pid, signal.SIGCONT)
