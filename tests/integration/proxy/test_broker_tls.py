"""Proxy → broker over TLS: brokers serve --tls-cert/--tls-key, the proxy verifies them against --broker-tls-ca."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate.cli.admin import BROKERS_MISSING
from popgate.cli.live import LiveView, Sample
from popgate.cli.main import main
from tests.integration.proxy.client import V2Client
from tests.pki import Issued, issue
from tests.procs import ServerProcess, broker_args, wait_until


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Issued:
    return issue(tmp_path_factory.mktemp("pki"), names=("localhost", "IP:127.0.0.1"))


@pytest.fixture(scope="module")
def tls_broker(pki: Issued, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("b1")
    tls = ("--tls-cert", str(pki.cert), "--tls-key", str(pki.key))
    broker = ServerProcess("broker", broker_args("b1", data, *tls)).start()
    yield broker
    broker.stop()


def proxy_for(broker: ServerProcess, *extra: str) -> ServerProcess:
    args = ["--broker", f"b1=localhost:{broker.port}", "--listen", "127.0.0.1:0", "--health-interval-s", "0.2"]
    return ServerProcess("proxy", [*args, *extra]).start()


def test_a_proxy_trusting_the_brokers_ca_sends_and_receives_over_tls(tls_broker: ServerProcess, pki: Issued) -> None:
    proxy = proxy_for(tls_broker, "--broker-tls-ca", str(pki.ca))
    client = V2Client(proxy.address)
    try:
        assert client.send("tls-topic", [b"over tls"]).status.code == 20000
        status, messages = client.receive("tls-topic", "g", poll_s=2)
        assert [m.body for m in messages] == [b"over tls"]
        assert client.ack("tls-topic", "g", messages).status.code == 20000
    finally:
        client.close()
        proxy.stop()


@pytest.mark.parametrize("trust", ["another CA", "plaintext"])
def test_a_proxy_that_cannot_verify_the_broker_sends_it_nothing(
    tls_broker: ServerProcess, tmp_path: Path, trust: str
) -> None:
    extra = ("--broker-tls-ca", str(issue(tmp_path, names=("localhost",)).ca)) if trust == "another CA" else ()
    proxy = proxy_for(tls_broker, *extra)
    client = V2Client(proxy.address)
    try:
        assert wait_until(lambda: any("is now down" in line for line in proxy.lines), timeout=10)
        assert client.send("tls-topic", [b"never stored"]).status.code != 20000
    finally:
        client.close()
        proxy.stop()


def test_popgate_stats_reaches_a_tls_broker_directly_with_its_ca(
    tls_broker: ServerProcess, pki: Issued, capsys: pytest.CaptureFixture[str]
) -> None:
    """The proxy-less emergency path (`popgate stats --broker`) speaks TLS to brokers as the proxy does."""
    broker = ["stats", "--broker", f"b1=localhost:{tls_broker.port}", "--json", "--endpoint", ""]
    assert main([*broker, "--broker-tls-ca", str(pki.ca)]) == 0
    assert main(broker) == BROKERS_MISSING  # plaintext against TLS: b1 does not answer, and is named
    assert "b1" in capsys.readouterr().err


def test_popgate_top_reaches_a_tls_broker_directly_with_its_ca(
    tls_broker: ServerProcess, pki: Issued, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`popgate top --broker` asks a TLS broker as `stats` does: it shows it answering, not DOWN."""
    samples: list[Sample] = []
    monkeypatch.setattr(LiveView, "run", lambda view, stop, interval: samples.append(view.poll()))  # one poll
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the test process keeps its own handlers
    broker = ["top", "--broker", f"b1=localhost:{tls_broker.port}", "--endpoint", ""]
    assert main([*broker, "--broker-tls-ca", str(pki.ca)]) == 0
    assert main(broker) == 0
    assert [sample.down for sample in samples] == [[], ["b1"]]  # plaintext against TLS: b1 does not answer
