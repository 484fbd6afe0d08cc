"""A server's TLS certificate, read again from its files while the server runs (docs/DEPLOY.md, "TLS").

A renewed certificate (cert-manager rewrites the Secret's files in the pod) is served to new connections within
`--tls-reload-s`, with no restart. Connections made before keep the certificate they were made with. Files that
do not load as a pair (a key that does not match its certificate, as in the middle of a rewrite) are logged and
skipped: the server goes on with the certificate it loaded last, and tries the files again once they change —
tests/integration/proxy/test_tls_reload.py.

The decision is pure (`Attempts`); `CertificateWatch` is the task that reads the files every interval, off the
event loop. `ServingContext` (an `ssl` server, popgate's h2 server) and `ServingCredentials` (a grpcio server)
hand the last certificate loaded to each new handshake. `TrustWatch` reads a CA bundle again the same way (the
proxy's for brokers). `CertificateMetrics` counts the reloads and shows when the certificate served expires.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pem:
    chain: bytes
    key: bytes


@dataclass(frozen=True, slots=True)
class Loaded:
    """A certificate chain and its key that load as a pair, and a server context made of them."""

    pem: Pem
    context: ssl.SSLContext


class Expired(ssl.SSLError):
    """The certificate's notAfter has passed: it is not served —
    tests/unit/process/test_certs.py::test_an_expired_certificate_is_not_served."""


class Changed(Exception):
    """The files changed while they were loaded: the context may hold neither the old pair nor the new."""


def read(cert: str, key: str) -> Pem:
    return Pem(Path(cert).read_bytes(), Path(key).read_bytes())


def load(cert: str, key: str, *, alpn: Sequence[str] = ()) -> Loaded:
    """The files as a server context; `ssl.SSLError` or `OSError` when they do not load as a pair, `Expired` when
    the certificate has expired (every client would refuse it), `Changed` when they changed meanwhile. Blocking
    (file reads): off the event loop once it serves."""
    before = read(cert, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)  # checks that the key is the certificate's
    not_after = expiry(before.chain)
    if not_after <= time.time():
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(not_after))
        raise Expired(ssl.SSL_ERROR_SSL, f"the certificate in {cert} expired at {when}")
    if alpn:
        context.set_alpn_protocols(list(alpn))
    if read(cert, key) != before:
        raise Changed(f"{cert} or {key} changed while it was loaded")
    return Loaded(before, context)


class Attempts:
    """Which contents of the files to try: each once, whether it loaded or not, so that files that do not load are
    reported once and tried again only when they change —
    tests/unit/process/test_certs.py::test_files_are_tried_once_per_content."""

    def __init__(self, loaded: object) -> None:
        self._tried = loaded

    def worth_trying(self, contents: object) -> bool:
        return contents != self._tried

    def tried(self, contents: object) -> None:
        self._tried = contents


class Serving(Protocol):
    pem: Pem  # what new connections are served with

    def serve(self, loaded: Loaded) -> None: ...


class ServingContext:
    """The context an `ssl` server is made with. Each handshake it starts goes on with the context loaded last
    (switched to in the server-name callback, which OpenSSL calls whether or not the client names a server)."""

    def __init__(self, loaded: Loaded) -> None:
        self.pem = loaded.pem
        self.context = loaded.context
        self._current = loaded.context
        self.context.sni_callback = self._pick

    def serve(self, loaded: Loaded) -> None:
        self.pem, self._current = loaded.pem, loaded.context

    def _pick(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        if self._current is not context:
            connection.context = self._current


class ServingCredentials:
    """A grpcio server's credentials: grpc asks for the certificate at each new connection, and gets the one
    loaded last when it changed since."""

    def __init__(self, loaded: Loaded) -> None:
        self.pem = loaded.pem
        self._next: Any = None
        self.credentials = grpc.dynamic_ssl_server_credentials(_configuration(loaded.pem), self._fetch)

    def serve(self, loaded: Loaded) -> None:
        self.pem, self._next = loaded.pem, _configuration(loaded.pem)

    def _fetch(self) -> Any:  # on one of grpc's threads: one swap, no lock needed under the GIL
        configuration, self._next = self._next, None
        return configuration


def _configuration(pem: Pem) -> Any:
    return grpc.ssl_server_certificate_configuration([(pem.key, pem.chain)])


class CertificateMetrics:
    """`popgate_<kind>_tls_reloads_total{outcome}` and `popgate_<kind>_tls_certificate_expiry_timestamp_seconds
    {certificate}`: the reads that found the files changed, and when the certificate served expires."""

    def __init__(self, registry: CollectorRegistry, kind: str) -> None:
        self._reloads = Counter(
            f"popgate_{kind}_tls_reloads",
            "Reads of TLS files that found them changed, by files (certificate: --tls-cert and --tls-key; broker_ca: "
            "--broker-tls-ca) and outcome: reloaded (new connections use them) or failed (unreadable, or not a "
            "certificate and its key, or no CA certificate: what was loaded before is still used)",
            ["files", "outcome"],
            registry=registry,
        )
        self._expiry = Gauge(
            f"popgate_{kind}_tls_certificate_expiry_timestamp_seconds",
            "When the certificate served to new connections expires (its notAfter), by --tls-cert file",
            ["certificate"],
            registry=registry,
        )

    def reloaded(self, outcome: str, files: str = "certificate") -> None:
        self._reloads.labels(files, outcome).inc()

    def serving(self, cert: str, pem: Pem) -> None:
        self._expiry.labels(cert).set(expiry(pem.chain))


def expiry(chain: bytes) -> float:
    """When the first certificate of a PEM chain (the server's own) expires, as a Unix time: its notAfter (RFC 5280
    §4.1.2.5), read from its DER encoding —
    tests/unit/process/test_certs.py::test_expiry_is_the_certificates_not_after."""
    text = chain.decode("ascii", errors="replace")
    start = text.index("-----BEGIN CERTIFICATE-----")
    end = text.index("-----END CERTIFICATE-----", start) + len("-----END CERTIFICATE-----")
    der = ssl.PEM_cert_to_DER_cert(text[start:end])
    _, certificate, _ = _element(der, 0)
    _, tbs, _ = _element(der, certificate)
    at = tbs
    if der[at] == 0xA0:  # [0] version: present from v2 on
        at = _element(der, at)[2]
    for _ in range(3):  # serialNumber, signature, issuer
        at = _element(der, at)[2]
    _, validity, _ = _element(der, at)
    tag, value, value_end = _element(der, _element(der, validity)[2])  # notBefore, then notAfter
    digits = der[value:value_end].decode("ascii").removesuffix("Z")
    if tag == 0x17:  # UTCTime, YYMMDDHHMMSS: years 1950..2049
        year = int(digits[:2])
        digits = str(2000 + year if year < 50 else 1900 + year) + digits[2:]
    moment = time.strptime(digits, "%Y%m%d%H%M%S")
    return float(calendar.timegm(moment))


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """The DER element at `at`: its tag, where its content starts and where it ends."""
    tag, length = der[at], der[at + 1]
    start = at + 2
    if length & 0x80:  # long form: the length in the next (length & 0x7F) bytes
        size = length & 0x7F
        length = int.from_bytes(der[start : start + size], "big")
        start += size
    return tag, start, start + length


class _Every:
    """`check()` every `interval_s` (0: never) while entered; `_read` reports files it cannot read once, until it can
    read them again."""

    interval_s: float
    _task: asyncio.Task[None] | None = None
    _unreadable = False

    async def __aenter__(self) -> _Every:
        if self.interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tls-reload")
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check()

    async def check(self) -> str:
        raise NotImplementedError

    def _failed(self, why: str) -> str:
        raise NotImplementedError

    async def _read(self, read: Callable[[], T]) -> T | None:
        """`read()` off the event loop; None when it fails (told once: `_failed` on the first failure of a run)."""
        try:
            contents = await asyncio.to_thread(read)
        except OSError as exc:  # between a rewrite's steps, or gone: what is used stays
            if not self._unreadable:
                self._unreadable = True
                self._failed(f"cannot be read ({exc})")
            return None
        self._unreadable = False
        return contents


class CertificateWatch(_Every):
    """Every `interval_s` (0: never), reads `cert` and `key`; files that changed and load as a pair are served to new
    connections."""

    def __init__(
        self,
        cert: str,
        key: str,
        serving: Serving,
        *,
        interval_s: float,
        alpn: Sequence[str] = (),
        metrics: CertificateMetrics | None = None,
    ) -> None:
        self.cert, self.key, self.interval_s, self.alpn = cert, key, interval_s, tuple(alpn)
        self._serving = serving
        self._metrics = metrics
        if metrics is not None:
            metrics.serving(cert, serving.pem)
        self._attempts = Attempts(serving.pem)

    async def check(self) -> str:
        """One look at the files: "unchanged", "reloaded", "failed" or "changing" (tried again next time)."""
        pem = await self._read(lambda: read(self.cert, self.key))
        if pem is None:
            return "failed"
        if not self._attempts.worth_trying(pem):
            return "unchanged"
        try:
            loaded = await asyncio.to_thread(load, self.cert, self.key, alpn=self.alpn)
        except Changed:
            return "changing"
        except Expired as exc:
            self._attempts.tried(pem)
            return self._failed(f"are not served: {exc}")
        except (OSError, ssl.SSLError) as exc:
            self._attempts.tried(pem)
            return self._failed(f"do not load as a pair ({exc})")
        self._attempts.tried(loaded.pem)
        self._serving.serve(loaded)
        log.info("TLS certificate reloaded from %s: new connections are served with it", self.cert)
        if self._metrics is not None:
            self._metrics.reloaded("reloaded", "certificate")
            self._metrics.serving(self.cert, loaded.pem)
        return "reloaded"

    def _failed(self, why: str) -> str:
        log.warning("TLS files %s and %s %s: still serving the certificate loaded before", self.cert, self.key, why)
        if self._metrics is not None:
            self._metrics.reloaded("failed", "certificate")
        return "failed"


def trusted(bundle: bytes) -> bytes:
    """`bundle`, when it holds a certificate a client can verify servers against; `ssl.SSLError` otherwise, for an
    empty file too (it would trust nothing, not the system's roots) —
    tests/unit/process/test_certs.py::test_a_changed_ca_bundle_is_trusted_once_it_holds_a_certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no default roots: only what `bundle` holds is counted
    try:
        context.load_verify_locations(cadata=bundle.decode("ascii", errors="replace"))
    except ValueError:  # empty
        raise ssl.SSLError(ssl.SSL_ERROR_SSL, "empty: it holds no certificate") from None
    if not context.cert_store_stats()["x509"]:
        raise ssl.SSLError(ssl.SSL_ERROR_SSL, "it holds no certificate")
    return bundle


class TrustWatch(_Every):
    """Every `interval_s` (0: never), reads the CA bundle `path`; a changed bundle that holds a CA certificate goes
    to `trust` (the proxy then verifies brokers against it on new connections). One that does not is reported
    once and changes nothing — tests/integration/proxy/test_tls_reload.py."""

    def __init__(
        self,
        path: str,
        current: bytes,
        trust: Callable[[bytes], None],
        *,
        interval_s: float,
        metrics: CertificateMetrics | None = None,
    ) -> None:
        self.path, self.interval_s = path, interval_s
        self._attempts = Attempts(current)
        self._trust = trust
        self._metrics = metrics

    async def check(self) -> str:
        """One look at the bundle: "unchanged", "reloaded" or "failed"."""
        bundle = await self._read(Path(self.path).read_bytes)
        if bundle is None:
            return "failed"
        if not self._attempts.worth_trying(bundle):
            return "unchanged"
        self._attempts.tried(bundle)
        try:
            trusted(bundle)
        except ssl.SSLError as exc:
            return self._failed(f"holds no CA certificate ({exc})")
        self._trust(bundle)
        log.info("CA bundle %s reloaded: new connections to brokers are verified against it", self.path)
        if self._metrics is not None:
            self._metrics.reloaded("reloaded", "broker_ca")
        return "reloaded"

    def _failed(self, why: str) -> str:
        log.warning("CA bundle %s %s: brokers are still verified against the one loaded before", self.path, why)
        if self._metrics is not None:
            self._metrics.reloaded("failed", "broker_ca")
        return "failed"
