"""A renewed certificate is served without a restart (--tls-reload-s): proxy (both of its servers) and broker read
their --tls-cert and --tls-key again, and new connections get the new pair; files that do not load as a pair change
nothing (docs/DEPLOY.md, "TLS")."""

from __future__ import annotations

import shutil
import socket
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate import Producer
from tests.integration.proxy.client import V2Client
from tests.pki import Issued, issue, renew
from tests.procs import ServerProcess, broker_args, wait_until

NAMES = ("localhost", "IP:127.0.0.1")
RELOAD = ("--tls-reload-s", "0.2")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Issued:
    return issue(tmp_path_factory.mktemp("pki"), names=NAMES)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess("broker", broker_args("b1", tmp_path_factory.mktemp("b1"))).start()
    yield process
    process.stop()


def install(pair: Issued, folder: Path) -> tuple[str, str]:
    """`pair` copied to the two files a server reads, as a Secret's volume holds them."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    shutil.copyfile(pair.cert, cert)
    shutil.copyfile(pair.key, key)
    return str(cert), str(key)


def served(port: int, ca: Path) -> bytes | None:
    """The certificate (DER) a new connection to `port` is served, as a client trusting `ca` sees it (no server name
    sent, as to an IP address); None when that client refuses it."""
    client = ssl.create_default_context(cafile=str(ca))
    client.check_hostname = False
    client.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with client.wrap_socket(raw) as tls:
                return tls.getpeercert(binary_form=True)
        except ssl.SSLCertVerificationError:
            return None


def der(pair: Issued) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert.read_text())


def tls_proxy(broker: ServerProcess, server: str, cert: str, key: str, *extra: str) -> ServerProcess:
    args = ["--broker", f"b1={broker.address}", "--listen", "127.0.0.1:0", "--server", server]
    return ServerProcess("proxy", [*args, "--tls-cert", cert, "--tls-key", key, *RELOAD, *extra]).start()


@pytest.mark.parametrize("server", ["h2", "grpcio"])
def test_a_renewed_certificate_reaches_new_connections_and_clients_connected_before_go_on(
    broker: ServerProcess, pki: Issued, tmp_path: Path, server: str
) -> None:
    proxy = tls_proxy(broker, server, *install(pki, tmp_path))
    topic = f"renew-{uuid.uuid4().hex[:8]}"
    try:
        with Producer(proxy.address, tls=pki.ca) as before:
            before.send(topic, b"before the renewal")
            assert served(proxy.port, pki.ca) == der(pki)
            renewed = renew(pki, names=NAMES)
            install(renewed, tmp_path)
            assert wait_until(lambda: served(proxy.port, pki.ca) == der(renewed), timeout=10)
            before.send(topic, b"on the connection made before")
            with Producer(proxy.address, tls=pki.ca) as after:
                after.send(topic, b"on a new connection")
        assert any("TLS certificate reloaded" in line for line in proxy.lines)
        assert proxy.alive()
    finally:
        proxy.stop()


@pytest.mark.parametrize("server", ["h2", "grpcio"])
def test_files_that_do_not_load_as_a_pair_leave_the_certificate_served_before(
    broker: ServerProcess, pki: Issued, tmp_path: Path, server: str
) -> None:
    cert, key = install(pki, tmp_path)
    proxy = tls_proxy(broker, server, cert, key)
    try:
        shutil.copyfile(renew(pki, names=NAMES).cert, cert)  # the new certificate beside the old key
        assert wait_until(lambda: any("do not load as a pair" in line for line in proxy.lines), timeout=10)
        assert served(proxy.port, pki.ca) == der(pki)
        with Producer(proxy.address, tls=pki.ca) as producer:
            producer.send(f"kept-{uuid.uuid4().hex[:8]}", b"served with the pair before")
        assert proxy.alive()
    finally:
        proxy.stop()


def test_a_broker_serves_its_renewed_certificate_to_new_connections(pki: Issued, tmp_path: Path) -> None:
    cert, key = install(pki, tmp_path)
    tls = ("--tls-cert", cert, "--tls-key", key, *RELOAD)
    broker = ServerProcess("broker", broker_args("b1", tmp_path / "data", *tls)).start()
    proxies: list[ServerProcess] = []

    def through_every_proxy_and_a_new_one() -> None:
        """A new proxy (a new connection to b1) and those before it send to b1."""
        args = ["--broker", f"b1=localhost:{broker.port}", "--listen", "127.0.0.1:0", "--broker-tls-ca", str(pki.ca)]
        proxies.append(ServerProcess("proxy", args).start())
        for proxy in proxies:
            client = V2Client(proxy.address)
            try:
                assert client.send("renewed-broker", [b"over tls"]).status.code == 20000
            finally:
                client.close()

    try:
        through_every_proxy_and_a_new_one()
        renewed = renew(pki, names=NAMES)
        install(renewed, tmp_path)
        assert wait_until(lambda: served(broker.port, pki.ca) == der(renewed), timeout=10)
        through_every_proxy_and_a_new_one()
    finally:
        for proxy in proxies:
            proxy.stop()
        broker.stop()


def test_a_proxy_verifies_brokers_against_its_reloaded_ca_bundle(pki: Issued, tmp_path: Path) -> None:
    """A broker's certificate now comes from a new CA, and the proxy's --broker-tls-ca file is rewritten with it:
    once the broker restarts (every connection to it new), the proxy reaches it with the CA it reloaded."""
    cert, key = install(pki, tmp_path)
    tls = ("--tls-cert", cert, "--tls-key", key, *RELOAD)
    broker = ServerProcess("broker", broker_args("b1", tmp_path / "data", *tls)).start()
    ca = tmp_path / "broker-ca.crt"
    shutil.copyfile(pki.ca, ca)
    args = ["--broker", f"b1=localhost:{broker.port}", "--listen", "127.0.0.1:0", "--broker-tls-ca", str(ca)]
    proxy = ServerProcess("proxy", [*args, "--health-interval-s", "0.2", *RELOAD]).start()
    client = V2Client(proxy.address)
    try:
        assert client.send("rotated-ca", [b"before"]).status.code == 20000
        rotated = issue(tmp_path / "rotated", names=NAMES, ca_name="popgate-test-ca-2")
        install(rotated, tmp_path)
        assert wait_until(lambda: served(broker.port, rotated.ca) == der(rotated), timeout=10)
        shutil.copyfile(rotated.ca, ca)
        assert wait_until(lambda: any("CA bundle" in line and "reloaded" in line for line in proxy.lines), timeout=10)
        port = broker.port
        broker.stop()
        listen = f"127.0.0.1:{port}"
        broker = ServerProcess("broker", broker_args("b1", tmp_path / "data", *tls, listen=listen)).start()
        assert wait_until(lambda: client.send("rotated-ca", [b"after"]).status.code == 20000, timeout=10)
        assert proxy.alive()
    finally:
        client.close()
        proxy.stop()
        broker.stop()
