"""popgate-proxy as an operator sees it: health, /metrics, dead brokers skipped, clean SIGTERM."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from popgate.cli.cluster import Child
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster
from tests.pki import issue, renew
from tests.procs import ServerProcess, broker_args


def wait_for_log(read: Callable[[], str], pattern: str, limit_s: float) -> re.Match[str]:
    end = time.monotonic() + limit_s
    while True:
        match = re.search(pattern, read())
        if match:
            return match
        assert time.monotonic() < end, f"{pattern!r} not logged within {limit_s} s"
        time.sleep(0.05)


def _held(stats: bpb.StatsResponse) -> tuple[int, int]:
    return stats.held_pops, stats.held_notifications


def test_health_metrics_and_clean_sigterm_with_a_held_receive(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(brokers=1, proxy_args=("--metrics-listen", "127.0.0.1:0"))
    proxy = cluster.proxies[0]
    with grpc.insecure_channel(cluster.endpoint) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    client = V2Client(cluster.endpoint)
    try:
        assert client.send("life", [b"one"]).status.code == v2.OK
        assert client.receive("life", "g", poll_s=1)[0].code == v2.OK
        metrics_address = wait_for_log(proxy.log_path.read_text, r"metrics on http://(\S+)/metrics", 10).group(1)
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert 'popgate_proxy_rpc_duration_seconds_count{code="OK",method="SendMessage"} 1.0' in text
        assert 'popgate_proxy_broker_rpcs_total{broker="b1",method="Send",outcome="ok"} 1.0' in text
        assert 'popgate_proxy_receives_total{group="g",mode="adaptive",outcome="messages"} 1.0' in text
        # The default adaptive mode served this lone receive by pop with notify; its first Pop found the message.
        assert 'popgate_proxy_receive_first_pop_hits_total{group="g"} 1.0' in text
        assert "popgate_proxy_receive_latency_seconds_count 1.0" in text
        assert re.search(r"# TYPE popgate_proxy_receive_first_pop_hits(_total)? counter", text)
        assert "_created" not in text  # no creation-time series beside every counter and histogram

        # A receive held at the broker for up to 20 s is answered (empty) as soon as the proxy stops.
        result: list[tuple[v2.Status, float]] = []

        def held_receive() -> None:
            started = time.monotonic()
            status, _ = client.receive("life", "g", poll_s=20)
            result.append((status, time.monotonic() - started))

        waiter = threading.Thread(target=held_receive)
        waiter.start()
        broker_address = cluster.brokers["b1"].address
        with grpc.insecure_channel(broker_address) as channel:
            stats = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
            end = time.monotonic() + 10
            # Held as a Notification (adaptive → pop with notify for a lone receive) or a Pop (longpoll).
            while sum(_held(stats.Stats(bpb.StatsRequest(), timeout=5))) < 1:
                assert time.monotonic() < end, "the receive was never held at the broker"
                time.sleep(0.02)
        proxy.terminate()
        waiter.join(10)
        assert result, "held receive not answered"
        status, took = result[0]
        assert status.code == v2.MESSAGE_NOT_FOUND and took < 5
        assert proxy.process is not None and proxy.process.wait(10) == 0
    finally:
        client.close()


def test_a_dead_broker_is_left_out_of_routes_and_sends(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(brokers=2)
    cluster.brokers["b2"].kill()
    client = V2Client(cluster.endpoint)
    try:
        for _ in range(4):  # round robin would hit b2 every other time: fail-over hides it
            assert client.send("dead", [b"x"]).status.code == v2.OK
        end = time.monotonic() + 10
        while True:
            route = client.stub.QueryRoute(pb.QueryRouteRequest(topic=v2.Resource(name="dead")), timeout=5)
            if {q.broker.name for q in route.message_queues} == {"b1"}:
                break
            assert time.monotonic() < end, "b2 still routed 10 s after it died"
            time.sleep(0.1)
    finally:
        client.close()


def test_tls_when_a_certificate_is_configured(make_cluster: MakeCluster, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    cluster = make_cluster(brokers=1, proxy_args=("--tls-cert", str(cert), "--tls-key", str(key)))
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with grpc.secure_channel(cluster.endpoint, credentials) as channel:
        stub = pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        route = stub.QueryRoute(pb.QueryRouteRequest(topic=v2.Resource(name="tls")), timeout=5)
        assert route.status.code == v2.OK
    with grpc.insecure_channel(cluster.endpoint) as channel:  # plaintext is refused
        with pytest.raises(grpc.RpcError):
            pb_grpc.MessagingServiceStub(channel).QueryRoute(pb.QueryRouteRequest(), timeout=2)  # type: ignore[no-untyped-call]


def test_brokers_may_be_given_by_dns_name(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(brokers=1)
    port = cluster.brokers["b1"].address.rpartition(":")[2]
    argv = [sys.executable, "-m", "proxy", "--listen", "127.0.0.1:0", "--broker", f"b1=localhost:{port}"]
    child = Child("dns-proxy", argv, cluster.config.data_dir / "dns-proxy.log")
    child.start()
    try:
        client = V2Client(child.wait_ready(30))
        try:
            assert client.send("dns", [b"resolved"]).status.code == v2.OK
            status, messages = client.receive("dns", "g", poll_s=2)
            assert [m.body for m in messages] == [b"resolved"], status
        finally:
            client.close()
    finally:
        assert child.stop() == 0


def _start_failure(argv: list[str]) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL
    )
    # grpc core may log its own line for a failed bind; ours is the last one
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


def test_start_up_failures_an_operator_fixes_with_a_flag_are_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    expired = renew(issue(tmp_path / "pki", names=("localhost",)), names=("localhost",), days=-1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        broker = ["-m", "broker", "--listen", "127.0.0.1:0", "--data-dir"]
        proxy = ["-m", "proxy", "--listen", "127.0.0.1:0", "--broker", "b1=127.0.0.1:1"]
        cases = [
            (broker + [str(a_file / "b1")], 1, f"cannot start: --data-dir {a_file / 'b1'}: Not a directory"),
            (broker + [str(tmp_path / "b2"), "--metrics-listen", busy], 1, f"--metrics-listen {busy}: cannot serve"),
            (broker + [str(tmp_path / "b3"), "--export-dir", str(a_file / "x")], 1, "--export-dir"),
            (["-m", "broker", "--listen", busy, "--data-dir", str(tmp_path / "b4")], 1, f"--listen {busy}: cannot"),
            (proxy + ["--metrics-listen", busy], 2, f"popgate-proxy: --metrics-listen {busy}: cannot serve"),
            (proxy + ["--export-dir", str(a_file / "x")], 2, "popgate-proxy: --export-dir"),
            (proxy + ["--log-level", "verbose"], 2, "popgate-proxy: --log-level='verbose' out of range"),
            (proxy + ["--broker-tls-ca", str(empty)], 2, f"popgate-proxy: --broker-tls-ca {empty}: empty"),
            (proxy + ["--tls-cert", str(expired.cert), "--tls-key", str(expired.key)], 2, f"{expired.cert} expired at"),
        ]
        for argv, code, says in cases:
            returncode, lines = _start_failure(argv)
            assert returncode == code, (argv, lines)
            assert says in lines[-1], (argv, lines)
            assert not [line for line in lines if "Traceback" in line or "never awaited" in line], (argv, lines)


def test_export_trouble_at_start_is_logged_and_the_broker_serves(tmp_path: Path) -> None:
    """A leftover of an earlier run it cannot open (here a directory of that name; another user's file alike) and
    a failed first snapshot keep no process from starting: as while it runs, the export logs them and retries."""
    export = tmp_path / "export"
    (export / ".broker-b1-5-19700101T000000Z-000000.jsonl.tmp").mkdir(parents=True)
    broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1", "--export-dir", str(export))).start()
    try:
        with grpc.insecure_channel(broker.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
            reply = stub.Send(bpb.SendRequest(messages=[bpb.Message(topic="t", body=b"x")]), timeout=10)
            assert len(reply.results) == 1
        assert any("cannot publish" in line for line in broker.lines)
    finally:
        assert broker.stop() == 0
    assert list(export.glob("broker-b1-*.jsonl"))  # this run's own snapshots are published
