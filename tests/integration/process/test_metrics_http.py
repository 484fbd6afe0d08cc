"""The /metrics endpoint every process serves: what a scraper, a probe or a curl gets back."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import CollectorRegistry, Counter

from popgate_process import metrics_http
from popgate_process.metrics_http import MetricsServer


def exchange(request: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send one raw HTTP request to a fresh server; (status line, headers, body)."""

    async def run() -> bytes:
        registry = CollectorRegistry()
        Counter("popgate_test_total", "a counter", registry=registry).inc()
        server = MetricsServer(registry)
        host, port = (await server.start("127.0.0.1:0")).rsplit(":", 1)
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(request)
            await writer.drain()
            answer = await reader.read()
            writer.close()
            return answer
        finally:
            await server.close()

    raw = asyncio.run(asyncio.wait_for(run(), 10))
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


def test_get_metrics_is_the_exposition() -> None:
    status, headers, body = exchange(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == "HTTP/1.1 200 OK" and b"popgate_test_total 1.0" in body
    assert int(headers["content-length"]) == len(body)


def test_head_gets_the_headers_of_get_without_a_body() -> None:
    status, headers, body = exchange(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == "HTTP/1.1 200 OK" and int(headers["content-length"]) > 0 and body == b""


def test_a_query_string_does_not_change_the_path() -> None:
    assert exchange(b"GET /healthz?probe=1 HTTP/1.1\r\n\r\n")[0] == "HTTP/1.1 200 OK"


def test_livez_answers_while_the_loop_turns() -> None:
    """What the servers' livenessProbe asks: 200 whatever their gRPC health says."""
    status, _, body = exchange(b"GET /livez HTTP/1.1\r\n\r\n")
    assert status == "HTTP/1.1 200 OK" and body == b"ok\n"


def test_other_methods_and_paths_are_refused_plainly() -> None:
    status, headers, _ = exchange(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert status == "HTTP/1.1 405 Method Not Allowed" and headers["allow"] == "GET, HEAD"
    assert exchange(b"GET /nope HTTP/1.1\r\n\r\n")[0] == "HTTP/1.1 404 Not Found"


def big_registry(series: int) -> CollectorRegistry:
    registry = CollectorRegistry()
    counter = Counter("popgate_test_total", "a counter", ["topic"], registry=registry)
    for i in range(series):
        counter.labels(f"topic-{i:06d}-" + "x" * 40).inc()
    return registry


def test_a_scraper_that_does_not_read_its_page_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each connection holds its own copy of the page until written: one that reads nothing is dropped after the
    write time, its copy with it, instead of holding it for the process's life."""
    monkeypatch.setattr(metrics_http, "WRITE_TIMEOUT_S", 0.5)

    async def run() -> int:
        server = MetricsServer(big_registry(40_000))  # a page of a few MB: more than the sockets' buffers
        host, port = (await server.start("127.0.0.1:0")).rsplit(":", 1)
        try:
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")  # and never reads
            loop = asyncio.get_running_loop()
            await asyncio.sleep(0.2)
            assert server.connections == 1
            deadline = loop.time() + 10
            while server.connections and loop.time() < deadline:  # noqa: ASYNC110 - the server's count, bounded
                await asyncio.sleep(0.05)
            sock.close()
            return server.connections
        finally:
            await server.close()

    assert asyncio.run(asyncio.wait_for(run(), 20)) == 0


def test_connections_past_the_bound_are_closed_unanswered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_http, "MAX_CONNECTIONS", 2)

    async def run() -> tuple[bytes, bytes]:
        server = MetricsServer(big_registry(1))
        host, port = (await server.start("127.0.0.1:0")).rsplit(":", 1)
        try:
            idle = [await asyncio.open_connection(host, int(port)) for _ in range(2)]  # send nothing: held
            await asyncio.sleep(0.1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
            try:
                refused = await asyncio.wait_for(reader.read(), 5)
            except ConnectionResetError:  # closed at once, unread: a reset
                refused = b""
            writer.close()
            for _, idle_writer in idle:
                idle_writer.close()
            await asyncio.sleep(0.1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            served = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return refused, served
        finally:
            await server.close()

    refused, served = asyncio.run(asyncio.wait_for(run(), 20))
    assert refused == b"" and served.startswith(b"HTTP/1.1 200 OK")
