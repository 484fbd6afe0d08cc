"""The /metrics endpoint every process serves: what a scraper, a probe or a curl gets back."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter

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


def test_other_methods_and_paths_are_refused_plainly() -> None:
    status, headers, _ = exchange(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert status == "HTTP/1.1 405 Method Not Allowed" and headers["allow"] == "GET, HEAD"
    assert exchange(b"GET /nope HTTP/1.1\r\n\r\n")[0] == "HTTP/1.1 404 Not Found"
