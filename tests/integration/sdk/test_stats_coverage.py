"""`popgate stats` never sums lag silently over part of the brokers (issue 30, point 1: the CLI).

3 brokers and a proxy; `stats` names every broker its figures leave out and exits with BROKERS_MISSING (75,
docs/SDK.md "Exit codes"): one that was not given but the proxy routes to, one that is stopped (SIGSTOP: it
holds its connections and answers nothing, as a hung broker does).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate import Producer
from popgate.cli.admin import BROKERS_MISSING
from popgate.cli.cluster import Cluster
from popgate.cli.main import main
from tests.integration.sdk.conftest import start_cluster

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
