"""A plaintext `popgate` command (or SDK client) against a TLS proxy is told to try --tls (tls=)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate import Producer, RetryPolicy, Unavailable, aio
from popgate.cli.cluster import Cluster
from popgate.cli.main import main
from popgate.cli.options import NOTHING_LISTENS

HINT = "(is the server using TLS? try --tls / --tls-ca)"


@pytest.fixture(scope="module")
def tls_proxy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A second proxy over the cluster's brokers, serving TLS with a self-signed certificate: address, cert."""
    tmp_path = tmp_path_factory.mktemp("tls")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subj = ["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"]
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subj]
    subprocess.run([*openssl, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    address = cluster.add_proxy(extra=("--tls-cert", str(cert), "--tls-key", str(key)))
    try:
        yield address, cert
    finally:
        cluster.proxies.pop().stop()


def test_a_plaintext_client_of_a_tls_proxy_is_told_to_try_tls(
    tls_proxy: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    address, cert = tls_proxy
    assert main(["send", "--endpoint", address, "t", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("popgate send: UNAVAILABLE: failed to connect to all addresses") and HINT in err, err
    assert main(["send", "--endpoint", address, "t", "x", "--tls-ca", str(cert)]) == 0  # the hint was right
    assert main(["send", "--endpoint", "127.0.0.1:1", "t", "x"]) == NOTHING_LISTENS  # TLS would not help
    err = capsys.readouterr().err
    assert "nothing listens at 127.0.0.1:1 (connection refused)" in err and HINT not in err, err


def test_dlq_resend_of_a_plaintext_client_is_told_to_try_tls(
    tls_proxy: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _ = tls_proxy
    assert main(["dlq", "resend", "g", "--endpoint", address, "--wait", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("popgate dlq resend: UNAVAILABLE: failed to connect to all addresses") and HINT in err, err


@pytest.mark.parametrize("client", ["sync", "aio"])
def test_a_plaintext_sdk_client_of_a_tls_proxy_is_told_to_try_tls(tls_proxy: tuple[str, Path], client: str) -> None:
    """The SDK says it too, not only the command line: gRPC reports only "Socket closed"."""
    address, cert = tls_proxy
    fast = RetryPolicy(max_attempts=1)
    if client == "sync":
        with Producer(address, retry=fast) as producer, pytest.raises(Unavailable) as info:
            producer.send("t", b"x")
    else:

        async def send() -> None:
            async with aio.Producer(address, retry=fast) as producer:
                await producer.send("t", b"x")

        with pytest.raises(Unavailable) as info:
            asyncio.run(send())
    assert "is the server using TLS? connect with tls=True" in str(info.value), info.value
    with Producer(address, tls=cert) as producer:
        assert producer.send("t", b"x").message_id  # the hint was right
    with Producer("127.0.0.1:1", retry=fast) as producer, pytest.raises(Unavailable) as info:
        producer.send("t", b"x")  # nothing listening: TLS would not help
    assert "TLS" not in str(info.value), info.value
