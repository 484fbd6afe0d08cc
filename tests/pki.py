"""A throwaway CA and server certificates signed by it (openssl in a subprocess), for TLS tests."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Issued:
    ca: Path  # the CA's certificate: what a client trusts
    cert: Path
    key: Path


def issue(folder: Path, *, names: tuple[str, ...], ca_name: str = "popgate-test-ca") -> Issued:
    """A new CA, and a server certificate for `names` (DNS names; an IP address as `IP:...`) signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    # A CA's own extensions, as a real one has (a strict verifier, Python 3.13's default context, wants keyUsage).
    ca_ext = ("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl(
        "req", "-x509", *_EC, *ca_ext, "-days", "1", "-subj", f"/CN={ca_name}", "-keyout", str(ca_key), "-out", str(ca)
    )
    return _server_certificate(folder, ca, names, "tls")


def renew(issued: Issued, *, names: tuple[str, ...], days: int = 1) -> Issued:
    """A new key and certificate for `names` from `issued`'s CA (its folder), as a renewal by the same issuer, valid
    for `days` (-1: one that expired a day ago)."""
    return _server_certificate(issued.ca.parent, issued.ca, names, "renewed" if days > 0 else "expired", days)


def _server_certificate(folder: Path, ca: Path, names: tuple[str, ...], stem: str, days: int = 1) -> Issued:
    ca_key = folder / "ca.key"
    key, csr, cert = folder / f"{stem}.key", folder / f"{stem}.csr", folder / f"{stem}.crt"
    _openssl("req", *_EC, "-subj", f"/CN={names[0]}", "-keyout", str(key), "-out", str(csr))
    sans = ",".join(name if name.startswith("IP:") else f"DNS:{name}" for name in names)
    leaf = "keyUsage=critical,digitalSignature\nauthorityKeyIdentifier=keyid\n"
    (folder / "san.ext").write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n{leaf}")
    _openssl(
        "x509", "-req", "-days", str(days), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-extfile", str(folder / "san.ext"), "-in", str(csr), "-out", str(cert),
    )  # fmt: skip
    return Issued(ca, cert, key)
