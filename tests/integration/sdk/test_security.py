"""Credentials (the v2 MQv2-HMAC-SHA1 header) and TLS.

The header the SDK builds is checked here on a tiny in-test gRPC server that records what it
got; the proxy's own checking of it (accounts, permissions, 40100/40300) is tested in
tests/integration/proxy/test_auth*.py and, with the official client, in tests/compat.
"""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import uuid
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from popgate import Producer, SimpleConsumer, Unauthorized
from popgate.cli.cluster import Cluster
from tests.integration.sdk.conftest import drain


class Recorder(pb_grpc.MessagingServiceServicer):
    """Answers SendMessage like a proxy would and keeps every call's metadata; refuses a wrong signature."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self.secrets = secrets
        self.calls: list[dict[str, str]] = []

    def SendMessage(self, request: pb.SendMessageRequest, context: Any) -> pb.SendMessageResponse:
        meta = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        self.calls.append(meta)
        fields = dict(part.strip().split("=", 1) for part in meta["authorization"].split(" ", 1)[1].split(","))
        secret = self.secrets.get(fields["Credential"], "")
        expected = hmac.new(secret.encode(), meta["x-mq-date-time"].encode(), hashlib.sha1).hexdigest()
        if fields["Signature"].lower() != expected:
            return pb.SendMessageResponse(status=v2.Status(code=v2.UNAUTHORIZED, message="bad signature"))
        ok = v2.Status(code=v2.OK)
        entries = [pb.SendResultEntry(status=ok, message_id=m.system_properties.message_id) for m in request.messages]
        return pb.SendMessageResponse(status=ok, entries=entries)


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, str]]:
    servicer = Recorder({"AK": "SK"})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_MessagingServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait(5)


def test_every_call_carries_a_valid_mqv2_hmac_sha1_header(recorder: tuple[Recorder, str]) -> None:
    servicer, address = recorder
    with Producer(address, access_key="AK", secret_key="SK") as producer:
        producer.send("t", b"one")
        producer.send_many("t", [b"two", b"three"])
    assert len(servicer.calls) == 2
    for meta in servicer.calls:
        auth = meta["authorization"]
        assert auth.startswith("MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time, Signature=")
        assert len(auth.rsplit("=", 1)[1]) == 40  # lower-case hex SHA-1
        assert meta["x-mq-protocol"] == "GRPC_V2" and meta["x-mq-client-id"] and meta["x-mq-request-id"]
    assert servicer.calls[0]["x-mq-request-id"] != servicer.calls[1]["x-mq-request-id"]
    assert "SK" not in str(servicer.calls)


def test_a_wrong_secret_is_refused_as_unauthorized(recorder: tuple[Recorder, str]) -> None:
    _, address = recorder
    with Producer(address, access_key="AK", secret_key="wrong") as producer:
        with pytest.raises(Unauthorized) as refused:
            producer.send("t", b"x")
    assert refused.value.code == v2.UNAUTHORIZED and not refused.value.retriable


def test_tls_with_a_custom_root_certificate(cluster: Cluster, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    address = cluster.add_proxy(extra=("--tls-cert", str(cert), "--tls-key", str(key)))
    topic, group = f"tls-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    try:
        with Producer(address, tls=cert) as producer, SimpleConsumer(address, group, topic, tls=cert) as consumer:
            producer.send(topic, b"over tls")
            assert [m.body for m in drain(consumer, 1)] == [b"over tls"]
    finally:
        child = cluster.proxies.pop()
        child.stop()
