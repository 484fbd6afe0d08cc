"""`popgate stats` never sums lag silently over part of the brokers (issue 30, point 1: the CLI).

3 brokers and a proxy; `stats` names every broker its figures leave out and exits with BROKERS_MISSING (75,
docs/SDK.md "Exit codes"): one that was not given but the proxy routes to, one that is stopped (SIGSTOP: it
holds its connections and answers nothing, as a hung broker does).
"""

from __future__ import annotations

import io
import json
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as bpb
from rich.console import Console

from popgate import Producer, SimpleConsumer
from popgate.cli import live
from popgate.cli.admin import BROKERS_MISSING, Broker, fetch_stats, stored_messages
from popgate.cli.cluster import Cluster
from popgate.cli.main import main
from tests.integration.sdk.conftest import drain, start_cluster
from tests.procs import ACCOUNTS, secured_cluster

TOPIC = "stats-coverage"


@pytest.fixture
def three(tmp_path: Path) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path / "data", brokers=3)
    try:
        yield cluster
    finally:
        cluster.brokers["b3"].signal(signal.SIGCONT)  # a stopped broker would not hear SIGTERM
        cluster.stop()


def brokers(cluster: Cluster, *names: str) -> list[str]:
    return [arg for name in names for arg in ("--broker", f"{name}={cluster.brokers[name].address}")]


def test_stats_names_the_brokers_its_figures_leave_out(three: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    with Producer(three.endpoint) as producer:
        producer.send_many(TOPIC, [b"m"] * 12)
    every = ["stats", "--endpoint", three.endpoint, "-t", TOPIC, "--timeout", "1"]
    assert main([*every, *brokers(three, "b1", "b2", "b3")]) == 0
    assert "(3 of 3 brokers)" in capsys.readouterr().out

    # Given one broker of three: the proxy names the other two (before: "(1 of 1 brokers)" and exit 0).
    assert main([*every, *brokers(three, "b1")]) == BROKERS_MISSING
    captured = capsys.readouterr()
    assert "(1 of 3 brokers)" in captured.out
    assert "broker b2: the proxy routes to it, but its address was not given" in captured.err
    assert "2 of 3 brokers missing: b2, b3;" in captured.err

    three.brokers["b3"].signal(signal.SIGSTOP)
    assert main([*every, *brokers(three, "b1", "b2", "b3"), "--json"]) == BROKERS_MISSING
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["brokers"]["missing"] == ["b3"] and document["brokers"]["answered"] == 2
    assert f"popgate stats: broker b3 at {three.brokers['b3'].address}: DEADLINE_EXCEEDED" in captured.err
    assert "1 of 3 brokers missing: b3;" in captured.err


def test_top_attaches_to_a_running_cluster_and_shows_unread_topics_and_unasked_brokers(
    three: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`popgate top -e E --broker b1 --broker b2`, then `popgate top -e E`: one refresh of the view each would show
    until Ctrl-C."""
    screens: list[str] = []

    class OneRefresh(live.LiveView):
        def run(self, stop: threading.Event, interval_s: float) -> None:
            console = Console(file=io.StringIO(), width=120, color_system=None)
            try:
                now = self.poll()
                console.print(live.render(self.frame(), now, None))
            finally:
                self.close()
            screens.append(console.file.getvalue())  # type: ignore[attr-defined]

    monkeypatch.setattr(live, "LiveView", OneRefresh)
    topic = f"top-unread-{uuid.uuid4().hex[:8]}"
    with Producer(three.endpoint) as producer:
        for _ in range(6):  # one send a broker, round robin: some on b1 and b2
            producer.send(topic, b"m")
    for variable in ("POPGATE_BROKERS", "POPGATE_BROKER"):
        monkeypatch.delenv(variable, raising=False)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        assert main(["top", "-e", three.endpoint, *brokers(three, "b1", "b2"), "--interval", "0.1"]) == 0
        assert main(["top", "-e", three.endpoint, "--interval", "0.1"]) == 0  # every broker, through the proxy
        assert main(["top", "-e", three.brokers["b1"].address, "--interval", "0.1"]) == 0  # not a proxy
    finally:
        for sig, handler in handlers.items():  # `top` set its own
            signal.signal(sig, handler)
    through = screens[1]
    # Pointed at something that is no proxy (a broker: no admin service), it says so, not "no topics yet".
    assert f"PROXY         the proxy at {three.brokers['b1'].address} did not gather" in screens[2]
    assert "NOT ASKED" not in through and "DOWN" not in through
    assert next(line for line in through.splitlines() if topic in line).split()[1:5] == ["-", "-", "-", "6"]
    screen = screens[0]
    assert "NOT ASKED     b3 (the proxy routes to them" in screen and "(Ctrl-C quits)" in screen
    row = next(line for line in screen.splitlines() if topic in line)
    given = [Broker(name, three.brokers[name].address) for name in ("b1", "b2")]
    stored = stored_messages(fetch_stats(given, bpb.StatsRequest(topic=topic), 5.0))[topic]
    assert row.split()[1:5] == ["-", "-", "-", str(stored)]  # no group reads it yet; its messages on b1, b2


def test_through_the_proxy_alone_stats_names_a_stopped_broker(
    three: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`popgate stats --endpoint E` and nothing else: the proxy's admin service asks every broker it routes to."""
    for variable in ("POPGATE_BROKERS", "POPGATE_BROKER"):
        monkeypatch.delenv(variable, raising=False)
    with Producer(three.endpoint) as producer:
        for _ in range(6):
            producer.send(TOPIC, b"m")
    through = ["stats", "--endpoint", three.endpoint, "-t", TOPIC, "--json"]
    assert main(through) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["brokers"]["answered"] == 3 and document["topics"] == [{"topic": TOPIC, "messages": 6}]

    three.brokers["b3"].signal(signal.SIGSTOP)
    assert main(through) == BROKERS_MISSING
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["brokers"]["missing"] == ["b3"] and document["brokers"]["answered"] == 2
    assert f"popgate stats: broker b3 (asked by the proxy at {three.endpoint}): " in captured.err
    assert "1 of 3 brokers missing: b3;" in captured.err


def test_through_a_proxy_with_accounts_stats_needs_an_admin_account(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The brokers want a token the command is not given: the proxy has it; the caller signs as v2 clients do."""
    for variable in ("POPGATE_BROKERS", "POPGATE_BROKER", "POPGATE_BROKER_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    with secured_cluster(tmp_path, ACCOUNTS) as cluster:
        through = ["stats", "-e", cluster.endpoint, "--json"]
        assert main([*through, "--access-key", "ops", "--secret-key", "ops-secret-0123456"]) == 0
        assert json.loads(capsys.readouterr().out)["brokers"]["answered"] == 2
        assert main([*through, "--access-key", "app", "--secret-key", "app-secret-0123456"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"popgate stats: the proxy at {cluster.endpoint} did not gather its brokers' stats: ")
        assert "PERMISSION_DENIED" in err and err.count("\n") == 1


def test_dlq_list_through_the_proxy_names_a_stopped_broker(
    three: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("POPGATE_BROKERS", "POPGATE_BROKER"):
        monkeypatch.delenv(variable, raising=False)
    group = "coverage-dlq"
    with Producer(three.endpoint) as producer, SimpleConsumer(three.endpoint, group, TOPIC) as consumer:
        for i in range(3):
            producer.send(TOPIC, f"poison {i}".encode())
        for message in drain(consumer, 3, ack=False):
            consumer.forward_to_dlq(message)
    assert main(["dlq", "list", group, "-e", three.endpoint]) == 0
    out = capsys.readouterr().out
    assert f"%DLQ%{group}: 3 message(s) not yet re-sent (3 stored)" in out and "poison 2" in out

    letters = {name: n for name, n in stored_on(three, f"%DLQ%{group}").items() if n}
    stopped = sorted(letters)[-1]  # a broker holding letters
    three.brokers[stopped].signal(signal.SIGSTOP)
    try:
        assert main(["dlq", "list", group, "-e", three.endpoint, "--json"]) == 0
        captured = capsys.readouterr()
    finally:
        three.brokers[stopped].signal(signal.SIGCONT)
    document = json.loads(captured.out)
    assert document["brokers"] == {"asked": 3, "answered": 2} and document["stored"] == 3 - letters[stopped]
    assert f"popgate dlq list: broker {stopped} (asked by the proxy at {three.endpoint}): " in captured.err


def stored_on(cluster: Cluster, topic: str) -> dict[str, int]:
    given = [Broker(name, child.address) for name, child in cluster.brokers.items()]
    return {
        name: stored_messages({name: reply}).get(topic, 0)
        for name, reply in fetch_stats(given, bpb.StatsRequest(topic=topic), 5.0).items()
    }
