"""What the LIVE deploy tests share: `popgate up`'s processes from its targets, bounded waits, Prometheus queries."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from .live_traffic import ProxyClient

T = TypeVar("T")
TOPIC = "deploy-live"
GROUP = "deploy-live-group"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, *, log: Path | None = None) -> T:
    """Poll `probe` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}", pytrace=False)
        time.sleep(0.2)


def http_get(url: str, timeout: float = 2.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return None


def health_serving(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def stop_process_group(proc: subprocess.Popen[bytes], extra_pids: list[int]) -> None:
    """SIGTERM what we started, wait (held long polls drain within 30 s), then SIGKILL leftovers (`popgate up`'s
    children get SIGTERM from the kernel when it dies: PR_SET_PDEATHSIG)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in extra_pids:  # children that left our process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(timeout=10)


@dataclass(frozen=True)
class Process:
    """A broker or proxy of `popgate up`, as its file_sd targets and its printed broker list tell."""

    kind: str  # "broker" | "proxy"
    name: str  # the `process` label
    metrics: str  # HOST:PORT of /metrics
    listen: str | None  # gRPC address (brokers)


@dataclass
class Cluster:
    proxy_endpoint: str
    brokers: list[Process]
    proxies: list[Process]
    targets: Path  # the file_sd file `popgate up` writes
    pid: int  # `popgate up` itself

    @property
    def processes(self) -> list[Process]:
        return self.brokers + self.proxies


def read_targets(path: Path, grpc_addresses: dict[str, str]) -> list[Process]:
    """The processes in a file_sd targets file (empty while it is not written yet)."""
    try:
        groups = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [
        Process(
            kind=group["labels"]["job"].removeprefix("popgate-"),
            name=group["labels"]["process"],
            metrics=group["targets"][0],
            listen=grpc_addresses.get(group["labels"]["process"]),
        )
        for group in groups
    ]


def printed_brokers(log: Path) -> dict[str, str]:
    """name -> gRPC address, from `popgate up`'s line "popgate: proxy endpoint E  (brokers b1=A, b2=B; logs ...)"."""
    for line in log.read_text().splitlines():
        if line.startswith("popgate: proxy endpoint") and "(brokers " in line:
            listed = line.split("(brokers ", 1)[1].split(";", 1)[0]
            return dict(entry.split("=", 1) for entry in listed.split(", "))
    return {}


def popgate_up_command() -> list[str]:
    try:
        import popgate.cli.main  # noqa: F401
    except ImportError as exc:
        pytest.fail(
            f"`popgate up` is not importable ({exc}). This live test needs the local cluster of the proxy issue "
            "(popgate.cli.main with `popgate up`); it fails instead of skipping so it cannot be forgotten.",
            pytrace=False,
        )
    script = Path(sys.executable).parent / "popgate"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from popgate.cli.main import main; sys.exit(main())"]


def send_traffic(cluster: Cluster) -> None:
    """A little traffic so that the labelled series exist: to each broker directly and through the proxy."""
    import grpc
    from popgate_pb import broker_pb2, broker_pb2_grpc

    for broker in cluster.brokers:
        assert broker.listen, f"no gRPC address found for {broker.name}"
        with grpc.insecure_channel(broker.listen) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            stub.Send(broker_pb2.SendRequest(messages=[broker_pb2.Message(topic=TOPIC, body=b"live")]), timeout=10)
            stub.Pop(
                broker_pb2.PopRequest(topic=TOPIC, group=GROUP, filter="*", max_messages=1, invisible_ms=60_000),
                timeout=10,
            )
    with ProxyClient(cluster.proxy_endpoint) as client:
        client.query_route(TOPIC)
        client.send(TOPIC, 1)


@dataclass
class Prometheus:
    url: str

    def query(self, promql: str) -> list[dict[str, Any]] | None:
        text = http_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        if text is None:
            return None
        reply = json.loads(text)
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])
