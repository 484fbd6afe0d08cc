"""Authentication end to end: a proxy with [[acl]] accounts and brokers with a shared token, driven by our SDK."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc

from popgate import PopgateError, Producer, SimpleConsumer, Unauthorized, aio
from popgate.cli.admin import Broker
from popgate.cli.cluster import Cluster
from popgate.cli.live import LiveView
from popgate.cli.main import main
from popgate_contract.broker_token import TOKEN_KEY
from tests.integration.sdk.conftest import drain
from tests.integration.sdk.test_aio import drain as drain_async
from tests.procs import BROKER_TOKEN, secured_cluster

CONFIG = """
broker_token = "broker-secret"
min_invisible_s = 1

[[acl]]
access_key = "alice"
secret_key = "alice-secret-0123456"
publish = ["orders", "auth-*"]
subscribe = ["orders", "auth-*"]
groups = ["billing", "dlq-origin"]

[[acl]]
access_key = "reader"
secret_key = "reader-secret-0123456"
subscribe = ["orders"]
groups = ["*"]

[[acl]]
access_key = "resender"
secret_key = "resender-secret-0123"
publish = ["auth-*"]
subscribe = ["%DLQ%dlq-origin"]
groups = ["popgate-dlq-resend"]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with secured_cluster(tmp_path_factory.mktemp("auth"), CONFIG) as started:
        yield started


def test_the_right_keys_send_receive_and_ack(cluster: Cluster) -> None:
    alice = {"access_key": "alice", "secret_key": "alice-secret-0123456"}
    topic = f"auth-{uuid.uuid4().hex[:8]}"
    with (
        Producer(cluster.endpoint, **alice) as producer,
        SimpleConsumer(cluster.endpoint, "billing", topic, **alice) as consumer,
    ):
        for i in range(4):  # round-robin: both brokers accept the proxy's token
            producer.send(topic, f"m{i}".encode())
        assert sorted(m.body for m in drain(consumer, 4)) == [b"m0", b"m1", b"m2", b"m3"]


@pytest.mark.parametrize(
    "keys",
    [
        {"access_key": "alice", "secret_key": "wrong"},
        {"access_key": "mallory", "secret_key": "alice-secret-0123456"},
        {},  # the header is sent with empty credentials
    ],
)
def test_wrong_unknown_or_missing_keys_are_unauthorized_40100(cluster: Cluster, keys: dict[str, str]) -> None:
    with Producer(cluster.endpoint, **keys) as producer, pytest.raises(Unauthorized) as caught:
        producer.send("orders", b"x")
    assert caught.value.code == 40100


def test_valid_keys_without_the_permission_are_forbidden_40300(cluster: Cluster) -> None:
    with Producer(cluster.endpoint, access_key="reader", secret_key="reader-secret-0123456") as producer:
        with pytest.raises(Unauthorized) as caught:
            producer.send("orders", b"readers do not publish")
        assert caught.value.code == 40300
    alice = {"access_key": "alice", "secret_key": "alice-secret-0123456"}
    with SimpleConsumer(cluster.endpoint, "not-billing", "orders", **alice) as consumer:
        with pytest.raises(Unauthorized) as caught:
            consumer.receive(max=1, wait=1)
        assert caught.value.code == 40300


def test_brokers_refuse_calls_without_the_token_but_answer_health_checks(cluster: Cluster) -> None:
    target = cluster.broker_targets()[0].split("=", 1)[1]
    with grpc.insecure_channel(target) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as caught:
            stub.Stats(bpb.StatsRequest(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as caught:
            stub.Stats(bpb.StatsRequest(), timeout=5, metadata=[(TOKEN_KEY, "guess")])
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stub.Stats(bpb.StatsRequest(), timeout=5, metadata=[(TOKEN_KEY, BROKER_TOKEN)])
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_proxy_without_the_broker_token_cannot_store(cluster: Cluster) -> None:
    address = cluster.add_proxy(extra=("--broker-token", ""))
    alice = {"access_key": "alice", "secret_key": "alice-secret-0123456"}
    with Producer(address, **alice) as producer, pytest.raises(PopgateError) as caught:
        producer.send("orders", b"x")
    assert caught.value.code not in (0, 20000)


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, and its key: the proxy's, and the clients' root."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


def test_credentials_over_tls(cluster: Cluster, tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    address = cluster.add_proxy(extra=("--tls-cert", str(cert), "--tls-key", str(key)))
    alice = {"access_key": "alice", "secret_key": "alice-secret-0123456"}
    topic = f"auth-tls-{uuid.uuid4().hex[:8]}"
    with (
        Producer(address, tls=cert, **alice) as producer,
        SimpleConsumer(address, "billing", topic, tls=cert, **alice) as consumer,
    ):
        producer.send(topic, b"signed, over tls")
        assert [m.body for m in drain(consumer, 1)] == [b"signed, over tls"]
    with Producer(address, tls=cert, access_key="alice", secret_key="wrong") as producer:
        with pytest.raises(Unauthorized):
            producer.send(topic, b"x")


def test_the_admin_commands_and_the_live_view_send_the_brokers_token(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"auth-{uuid.uuid4().hex[:8]}"
    with Producer(cluster.endpoint, access_key="alice", secret_key="alice-secret-0123456") as producer:
        producer.send(topic, b"x")
    brokers = [arg for target in cluster.broker_targets() for arg in ("--broker", target)]
    assert main(["stats", *brokers, "--topic", topic, "--broker-token", BROKER_TOKEN]) == 0
    assert topic in capsys.readouterr().out
    monkeypatch.setenv("POPGATE_BROKER_TOKEN", BROKER_TOKEN)  # as `popgate up` children get it
    assert main(["dlq", "list", "billing", *brokers]) == 0
    assert "%DLQ%billing: 0 message(s)" in capsys.readouterr().out
    asked = [Broker(*target.split("=", 1), BROKER_TOKEN) for target in cluster.broker_targets()]
    assert LiveView(cluster.endpoint, asked).poll().down == []


def test_dlq_resend_needs_the_dlq_the_resend_group_and_the_origin_topics(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rights docs/SDK.md and docs/PROXY.md name for `popgate dlq resend` with accounts on: `subscribe` on
    `%DLQ%<group>`, `groups` on `popgate-dlq-resend`, `publish` on the letters' origin topics; they suffice."""
    topic = f"auth-{uuid.uuid4().hex[:8]}"
    alice = {"access_key": "alice", "secret_key": "alice-secret-0123456"}
    with (
        Producer(cluster.endpoint, **alice) as producer,
        SimpleConsumer(cluster.endpoint, "dlq-origin", topic, **alice) as consumer,
    ):
        producer.send(topic, b"poison pill")
        consumer.forward_to_dlq(drain(consumer, 1, ack=False)[0])
    resend = ["dlq", "resend", "dlq-origin", "-e", cluster.endpoint, "--wait", "2"]
    assert main([*resend, "--access-key", "reader", "--secret-key", "reader-secret-0123456"]) == 1
    assert "FORBIDDEN: access key reader may not subscribe to topic %DLQ%dlq-origin" in capsys.readouterr().err
    assert main([*resend, "--access-key", "resender", "--secret-key", "resender-secret-0123"]) == 0
    assert f"resent 1 message(s) from %DLQ%dlq-origin: 1 to {topic}" in capsys.readouterr().err


ALICE = {"access_key": "alice", "secret_key": "alice-secret-0123456"}


async def test_the_asyncio_clients_sign_every_call(cluster: Cluster) -> None:
    topic = f"auth-{uuid.uuid4().hex[:8]}"
    async with (
        aio.Producer(cluster.endpoint, **ALICE) as producer,
        aio.SimpleConsumer(cluster.endpoint, "billing", topic, **ALICE) as consumer,
    ):
        await producer.send_many(topic, [b"a0", b"a1", b"a2", b"a3"])
        got = await drain_async(consumer, 4)  # acks each batch: AckError should an ack be refused
        assert sorted(m.body for m in got) == [b"a0", b"a1", b"a2", b"a3"]
    wrong = {"access_key": "alice", "secret_key": "wrong"}
    async with aio.Producer(cluster.endpoint, **wrong) as producer:
        with pytest.raises(Unauthorized) as caught:
            await producer.send(topic, b"x")
        assert caught.value.code == 40100
    async with aio.SimpleConsumer(cluster.endpoint, "billing", topic, **wrong) as consumer:
        with pytest.raises(Unauthorized) as caught:
            await consumer.receive(max=1, wait=1)
        assert caught.value.code == 40100


async def test_the_asyncio_clients_over_tls_with_a_custom_root_certificate(cluster: Cluster, tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    address = cluster.add_proxy(extra=("--tls-cert", str(cert), "--tls-key", str(key)))
    topic = f"auth-tls-{uuid.uuid4().hex[:8]}"
    try:
        async with (
            aio.Producer(address, tls=cert, **ALICE) as producer,
            aio.SimpleConsumer(address, "billing", topic, tls=cert, **ALICE) as consumer,
        ):
            await producer.send(topic, b"signed, over tls, asyncio")
            assert [m.body for m in await drain_async(consumer, 1)] == [b"signed, over tls, asyncio"]
        async with aio.Producer(address, tls=cert, access_key="alice", secret_key="wrong") as producer:
            with pytest.raises(Unauthorized):
                await producer.send(topic, b"x")
    finally:
        cluster.proxies.pop().stop()
