"""A server's certificate read again from its files (popgate_process.certs): real TLS handshakes over a Unix socket,
one server context whose new handshakes get the certificate loaded last."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from popgate_process import certs
from tests.pki import Issued, issue, renew


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Issued, Issued]:
    """Two certificates for 127.0.0.1, each signed by a CA of its own."""
    folder = tmp_path_factory.mktemp("pki")
    return (
        issue(folder / "a", names=("localhost", "IP:127.0.0.1"), ca_name="ca-a"),
        issue(folder / "b", names=("localhost", "IP:127.0.0.1"), ca_name="ca-b"),
    )


def install(pair: Issued, folder: Path) -> tuple[str, str]:
    """`pair`'s certificate and key copied to the two files a server reads (as a Secret's volume has them)."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    shutil.copyfile(pair.cert, cert)
    shutil.copyfile(pair.key, key)
    return str(cert), str(key)


async def handshake(path: str, ca: Path) -> bool:
    """Whether a client trusting only `ca` completes a TLS handshake with the server. It sends no server name, as a
    client of an IP address does not (the certificate's chain is what is checked, not its names)."""
    client = ssl.create_default_context(cafile=str(ca))
    client.check_hostname = False
    client.set_alpn_protocols(["h2"])
    try:
        _, writer = await asyncio.open_unix_connection(path, ssl=client, server_hostname="")
    except ssl.SSLCertVerificationError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


def reloads(registry: CollectorRegistry, files: str = "certificate") -> dict[str, float]:
    name = "popgate_test_tls_reloads_total"
    values = {o: registry.get_sample_value(name, {"files": files, "outcome": o}) for o in ("reloaded", "failed")}
    return {outcome: value for outcome, value in values.items() if value}


def not_after(cert: Path) -> float:
    """The certificate's notAfter as openssl prints it, as a Unix time."""
    out = subprocess.run(["openssl", "x509", "-enddate", "-noout", "-in", str(cert)], capture_output=True, check=True)
    return ssl.cert_time_to_seconds(out.stdout.decode().strip().removeprefix("notAfter="))


async def serve(context: ssl.SSLContext, path: str) -> asyncio.Server:
    async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    return await asyncio.start_unix_server(hang_up, path, ssl=context)


async def test_a_renewed_certificate_serves_new_connections_and_files_that_do_not_load_change_nothing(
    pairs: tuple[Issued, Issued], tmp_path: Path
) -> None:
    a, b = pairs
    cert, key = install(a, tmp_path)
    serving = certs.ServingContext(certs.load(cert, key, alpn=("h2",)))
    registry = CollectorRegistry()
    watch = certs.CertificateWatch(
        cert, key, serving, interval_s=0, alpn=("h2",), metrics=certs.CertificateMetrics(registry, "test")
    )
    path = str(tmp_path / "server.sock")
    server = await serve(serving.context, path)
    try:
        assert await handshake(path, a.ca) and not await handshake(path, b.ca)
        assert await watch.check() == "unchanged"

        shutil.copyfile(b.cert, cert)  # half-way through a rewrite: the new certificate, the old key
        assert await watch.check() == "failed"
        assert await handshake(path, a.ca), "the pair loaded before is still served"
        assert await watch.check() == "unchanged", "the same files are not tried (nor reported) again"

        shutil.copyfile(b.key, key)
        assert await watch.check() == "reloaded"
        assert await handshake(path, b.ca) and not await handshake(path, a.ca)
        assert reloads(registry) == {"failed": 1, "reloaded": 1}
    finally:
        server.close()
        await server.wait_closed()


async def test_files_that_cannot_be_read_are_reported_once_and_the_certificate_stays(
    pairs: tuple[Issued, Issued], tmp_path: Path
) -> None:
    a, _ = pairs
    cert, key = install(a, tmp_path)
    serving = certs.ServingContext(certs.load(cert, key))
    registry = CollectorRegistry()
    watch = certs.CertificateWatch(cert, key, serving, interval_s=0, metrics=certs.CertificateMetrics(registry, "test"))
    await asyncio.to_thread(Path(key).unlink)
    assert [await watch.check(), await watch.check()] == ["failed", "failed"]
    assert reloads(registry) == {"failed": 1}
    install(a, tmp_path)
    assert await watch.check() == "unchanged"  # the same pair as served: nothing to load


def test_files_are_tried_once_per_content() -> None:
    first, second = certs.Pem(b"chain", b"key"), certs.Pem(b"chain 2", b"key")
    attempts = certs.Attempts(first)
    assert not attempts.worth_trying(first)
    assert attempts.worth_trying(second)
    attempts.tried(second)
    assert not attempts.worth_trying(second) and attempts.worth_trying(first)


def test_a_pair_that_changes_while_it_loads_is_not_served(pairs: tuple[Issued, Issued], tmp_path: Path) -> None:
    a, b = pairs
    cert, key = install(a, tmp_path)
    real = ssl.SSLContext.load_cert_chain

    def rewritten_meanwhile(context: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        real(context, *args, **kwargs)  # type: ignore[arg-type]
        install(b, tmp_path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ssl.SSLContext, "load_cert_chain", rewritten_meanwhile)
        with pytest.raises(certs.Changed):
            certs.load(cert, key)


async def test_an_expired_certificate_is_not_served(pairs: tuple[Issued, Issued], tmp_path: Path) -> None:
    """A pair that loads but whose certificate has expired (every client refuses it) is a failed reload: the
    certificate before stays served. At start it is the start's error."""
    a, _ = pairs
    expired = await asyncio.to_thread(renew, a, names=("localhost", "IP:127.0.0.1"), days=-1)
    with pytest.raises(ssl.SSLError, match="expired"):
        certs.load(str(expired.cert), str(expired.key))
    cert, key = install(a, tmp_path)
    serving = certs.ServingContext(certs.load(cert, key, alpn=("h2",)))
    registry = CollectorRegistry()
    watch = certs.CertificateWatch(cert, key, serving, interval_s=0, metrics=certs.CertificateMetrics(registry, "test"))
    await asyncio.to_thread(install, expired, tmp_path)
    assert [await watch.check(), await watch.check()] == ["failed", "unchanged"]
    assert reloads(registry) == {"failed": 1}
    path = str(tmp_path / "tls.sock")
    server = await serve(serving.context, path)
    try:
        assert await handshake(path, a.ca), "the certificate loaded before is still served"
    finally:
        server.close()
        await server.wait_closed()


def test_expiry_is_the_certificates_not_after(pairs: tuple[Issued, Issued], tmp_path: Path) -> None:
    a, b = pairs
    chain = a.cert.read_bytes() + a.ca.read_bytes()  # the server's certificate first, then its issuer's
    assert certs.expiry(chain) == not_after(a.cert)
    cert, key = install(a, tmp_path)
    registry = CollectorRegistry()
    metrics = certs.CertificateMetrics(registry, "test")
    certs.CertificateWatch(cert, key, certs.ServingContext(certs.load(cert, key)), interval_s=0, metrics=metrics)
    gauge = "popgate_test_tls_certificate_expiry_timestamp_seconds"
    assert registry.get_sample_value(gauge, {"certificate": cert}) == not_after(a.cert)


async def test_a_changed_ca_bundle_is_trusted_once_it_holds_a_certificate(
    pairs: tuple[Issued, Issued], tmp_path: Path
) -> None:
    a, b = pairs
    path = tmp_path / "ca.crt"
    await asyncio.to_thread(shutil.copyfile, a.ca, path)
    trusted: list[bytes] = []
    registry = CollectorRegistry()
    metrics = certs.CertificateMetrics(registry, "test")
    watch = certs.TrustWatch(str(path), a.ca.read_bytes(), trusted.append, interval_s=0, metrics=metrics)
    assert await watch.check() == "unchanged"
    await asyncio.to_thread(path.write_bytes, b"not a certificate\n")
    assert [await watch.check(), await watch.check()] == ["failed", "unchanged"]
    await asyncio.to_thread(path.write_bytes, b"")  # the first step of a rewrite, or an empty Secret key
    assert [await watch.check(), await watch.check()] == ["failed", "unchanged"]
    assert trusted == [], "a bundle without a CA certificate is not trusted"
    bundle = a.ca.read_bytes() + b.ca.read_bytes()  # both CAs while the brokers' certificates change issuer
    await asyncio.to_thread(path.write_bytes, bundle)
    assert await watch.check() == "reloaded"
    assert trusted == [bundle]
    assert reloads(registry, "broker_ca") == {"failed": 2, "reloaded": 1}
