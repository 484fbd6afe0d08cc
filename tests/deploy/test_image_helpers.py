"""The scripts the server image adds for the pods (deploy/image/): the export relay and the TLS health probe.

Both run here as the pods run them, as processes; every wait is bounded and every process stopped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .conftest import DEPLOY, run, tool

RELAY = DEPLOY / "image" / "export_relay.py"
PROBE = DEPLOY / "image" / "health_probe.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def relay() -> ModuleType:
    spec = importlib.util.spec_from_file_location("export_relay", RELAY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def write(path: Path, text: str, *, age_s: float = 0.0) -> Path:
    path.write_text(text)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """An export directory as a pod has it, served by `popgate-export-relay serve` on a free port."""
    export = tmp_path / "export"
    export.mkdir()
    write(export / "broker-popgate-broker-0-1700000000000-20260101T000000Z-0.jsonl", '{"a": 1}\n', age_s=120)
    write(export / "broker-popgate-broker-0-1700000000000-20260101T000100Z-1.jsonl", '{"a": 2}\n' * 1000)
    write(export / ".broker-popgate-broker-0-1700000000000-20260101T000200Z-2.jsonl.tmp", '{"a": 3}\n')
    write(export / "broker.sqlite3", "not an export")
    with serving(export, tmp_path / "relay.log") as answer:
        yield answer


@contextlib.contextmanager
def serving(export: Path, log: Path, *flags: str) -> Iterator[tuple[Path, int]]:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(RELAY), "serve", "--dir", str(export), "--listen", f"127.0.0.1:{port}", *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 20
        while get(port, "/healthz") != b"ok\n":
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield export, port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def get(port: int, path: str) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return bytes(answer.read())
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}".encode()
    except OSError:
        return None


def collect(port: int, into: Path) -> subprocess.CompletedProcess[str]:
    args = ["collect", "--service", "127.0.0.1", "--port", str(port), "--into", str(into), "--timeout-s", "5"]
    return subprocess.run([sys.executable, str(RELAY), *args], capture_output=True, text=True, timeout=60)


def test_serve_lists_and_gives_finished_files_only(served: tuple[Path, int]) -> None:
    export, port = served
    listing = json.loads(get(port, "/files") or b"")
    names = [entry["name"] for entry in listing]
    assert names == sorted(p.name for p in export.glob("broker-*.jsonl"))  # oldest first; no .tmp, no store
    assert get(port, f"/files/{names[1]}") == (export / names[1]).read_bytes()
    for path in ("/files/broker.sqlite3", "/files/../broker.sqlite3", "/files/.." + names[0], "/", "/files/"):
        assert get(port, path) == b"HTTP 404", path


def test_collect_copies_each_finished_file_once_whole_with_its_time(served: tuple[Path, int], tmp_path: Path) -> None:
    export, port = served
    into = tmp_path / "snapshots"
    first = collect(port, into)
    assert first.returncode == 0, first.stderr
    assert "copied 2 files from 1 of 1 pods" in first.stdout
    copied = sorted(into.iterdir())
    assert [p.name for p in copied] == sorted(p.name for p in export.glob("broker-*.jsonl"))  # no partial files
    for path in copied:
        assert path.read_bytes() == (export / path.name).read_bytes()
        assert path.stat().st_mtime == pytest.approx((export / path.name).stat().st_mtime, abs=1e-3)
    write(export / "proxy-p-8081-1700000000000-20260101T000300Z-0.jsonl", "{}\n")
    second = collect(port, into)
    assert "copied 1 files from 1 of 1 pods" in second.stdout, second.stdout + second.stderr


def test_collect_fails_when_no_pod_answers(tmp_path: Path) -> None:
    result = collect(free_port(), tmp_path / "snapshots")
    assert result.returncode == 1
    assert "copied 0 files from 0 of 1 pods" in result.stdout and "127.0.0.1" in result.stderr


def test_prune_keeps_the_directory_within_age_and_bytes(relay: ModuleType, tmp_path: Path) -> None:
    now = time.time()
    old = write(tmp_path / "proxy-p-1-20260101T000000Z-0.jsonl", "x" * 10, age_s=3 * 3600)
    a = write(tmp_path / "proxy-p-1-20260101T010000Z-1.jsonl", "x" * 100, age_s=600)
    b = write(tmp_path / "proxy-p-1-20260101T020000Z-2.jsonl", "x" * 100, age_s=60)
    tmp = write(tmp_path / ".proxy-p-1-20260101T030000Z-3.jsonl.tmp", "x" * 1000, age_s=5 * 3600)
    store = write(tmp_path / "broker.sqlite3", "x", age_s=5 * 3600)
    gone = relay.prune(tmp_path, keep_s=7200, max_bytes=150, now=now)
    assert gone == [old.name, a.name]  # too old, then the oldest while over budget
    assert b.exists() and tmp.exists() and store.exists()  # in progress and not ours: never touched
    assert relay.prune(tmp_path / "missing", keep_s=1, max_bytes=1, now=now) == []


def test_prune_deletes_collected_files_first(relay: ModuleType, tmp_path: Path) -> None:
    now = time.time()
    a = write(tmp_path / "proxy-p-1-20260101T010000Z-1.jsonl", "x" * 100, age_s=600)
    b = write(tmp_path / "proxy-p-1-20260101T020000Z-2.jsonl", "x" * 100, age_s=300)
    c = write(tmp_path / "proxy-p-1-20260101T030000Z-3.jsonl", "x" * 100, age_s=60)
    assert relay.prune(tmp_path, keep_s=7200, max_bytes=150, now=now, collected={b.name}) == [b.name, a.name]
    assert c.exists()


def test_serve_says_when_it_deleted_files_never_collected(tmp_path: Path) -> None:
    """Over --max-bytes, a served file goes first; one that no collector fetched is named on the log."""
    export = tmp_path / "export"
    export.mkdir()
    old = write(export / "proxy-p-1-20260101T000000Z-0.jsonl", "x" * 100, age_s=300)
    fetched = write(export / "proxy-p-1-20260101T000100Z-1.jsonl", "x" * 100, age_s=200)
    log = tmp_path / "relay.log"
    with serving(export, log, "--max-bytes", "250", "--prune-every-s", "0.1") as (_, port):
        assert get(port, f"/files/{fetched.name}") == fetched.read_bytes()
        time.sleep(0.2)  # the relay counts a file collected once its last byte is written, after the reader has it
        newest = write(export / "proxy-p-1-20260101T000200Z-2.jsonl", "x" * 100)
        write(export / "proxy-p-1-20260101T000300Z-3.jsonl", "x" * 100)
        deadline = time.monotonic() + 20
        while "never collected" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert not fetched.exists() and not old.exists() and newest.exists()
    lines = log.read_text().splitlines()
    assert f"deleted 1 finished files never collected (oldest {old.name}, newest {old.name})" in lines[-1]


# --- the TLS health probe ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a server certificate for the name popgate-proxy, as cert-manager's CA issuer makes them."""
    openssl, d = tool("openssl"), tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca = [openssl, "req", "-x509", *ec, "-days", "1", "-subj", "/CN=popgate-ca"]
    run([*ca, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt")])
    run([openssl, "req", *ec, "-subj", "/CN=popgate-proxy", "-keyout", str(d / "tls.key"), "-out", str(d / "tls.csr")])
    (d / "san.ext").write_text("subjectAltName=DNS:popgate-proxy\nextendedKeyUsage=serverAuth\n")
    sign = [openssl, "x509", "-req", "-days", "1", "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key")]
    run(
        [
            *sign,
            "-CAcreateserial",
            "-extfile",
            str(d / "san.ext"),
            "-in",
            str(d / "tls.csr"),
            "-out",
            str(d / "tls.crt"),
        ]
    )
    return d


@pytest.fixture
def tls_server(pki: Path) -> Iterator[tuple[int, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials([((pki / "tls.key").read_bytes(), (pki / "tls.crt").read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield port, servicer
    finally:
        server.stop(grace=None).wait(timeout=5)


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=30)


def test_probe_passes_over_tls_only_for_a_serving_server_with_the_right_name(
    pki: Path, tls_server: tuple[int, health.HealthServicer]
) -> None:
    port, servicer = tls_server
    target = f"127.0.0.1:{port}"
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    ok = probe("--tls-ca", str(pki / "ca.crt"), "--server-name", "popgate-proxy", "--timeout-s", "5", target)
    assert ok.returncode == 0, ok.stderr
    wrong_name = probe("--tls-ca", str(pki / "ca.crt"), "--server-name", "other", "--timeout-s", "2", target)
    assert wrong_name.returncode == 1 and "UNAVAILABLE" in wrong_name.stderr
    plaintext = probe("--timeout-s", "2", target)  # what kubelet's grpc probe would do
    assert plaintext.returncode == 1
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    stopping = probe("--tls-ca", str(pki / "ca.crt"), "--server-name", "popgate-proxy", "--timeout-s", "5", target)
    assert (stopping.returncode, stopping.stderr.strip()) == (1, f"popgate-grpc-health: {target}: NOT_SERVING")
    missing_ca = probe("--tls-ca", str(pki / "nope.crt"), "--timeout-s", "2", target)
    assert missing_ca.returncode == 1 and "nope.crt" in missing_ca.stderr
